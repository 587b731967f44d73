#include "tools/atfill/args.hpp"

#include <cstdio>
#include <vector>

#include "tools/atfill/cli.hpp"

namespace atfill::cli {

void PrepareVerbApp(CLI::App& app) {
  app.set_help_flag();  // --help is the verb's own text (WantsHelp)
  // Options may come anywhere among the positionals, as the verbs always allowed.
  app.positionals_at_end(false);
}

CLI::Validator PositiveInteger(const std::string& what) {
  return CLI::Validator(
      [what](std::string& value) -> std::string {
        const bool digits = !value.empty() && value.size() <= 19 &&
                            value.find_first_not_of("0123456789") == std::string::npos;
        if (digits && value.find_first_not_of('0') != std::string::npos) return "";
        return "'" + value + "' is not " + what + " (a whole number from 1)";
      },
      "POSITIVE");
}

std::optional<int> ParseVerbArgs(CLI::App& app, std::span<char* const> args) {
  // CLI11 takes the arguments in reverse order.
  std::vector<std::string> reversed(args.rbegin(), args.rend());
  try {
    app.parse(reversed);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "%s: %s (%s --help shows the usage)\n", app.get_name().c_str(), e.what(),
                 app.get_name().c_str());
    return kExitUsage;
  }
  return std::nullopt;
}

}  // namespace atfill::cli
