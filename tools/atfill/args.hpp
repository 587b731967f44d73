// A verb's command line, parsed by CLI11. Each verb declares its positionals and options on a
// CLI::App and hands it its arguments here; --help is answered before (cli.hpp WantsHelp, with the
// verb's own text), so CLI11's help flag is off.
#pragma once

#include <CLI/CLI.hpp>

#include <optional>
#include <span>
#include <string>

namespace atfill::cli {

// Sets up `app` (named "atfill VERB") for a verb: no CLI11 help flag, options anywhere among the
// positionals.
void PrepareVerbApp(CLI::App& app);

// Accepts a whole number from 1 up (a job id, a count); otherwise "'X' is not <what> (a whole
// number from 1)".
CLI::Validator PositiveInteger(const std::string& what);

// Parses `args` (the verb's arguments, the program and verb names excluded). nullopt when they
// parse; otherwise the usage error is printed as "atfill VERB: <reason>" with the verb's usage
// line, and the exit code to return (kExitUsage) is given.
std::optional<int> ParseVerbArgs(CLI::App& app, std::span<char* const> args);

}  // namespace atfill::cli
