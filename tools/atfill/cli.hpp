// The launcher's verbs. Each verb parses its own arguments and returns the process exit code.
#pragma once

#include <span>
#include <string_view>

namespace atfill::cli {

// Exit codes shared by every verb (README lists them).
inline constexpr int kExitOk = 0;
inline constexpr int kExitInputInvalid = 1;  // some input was rejected; the rest was processed
inline constexpr int kExitUsage = 2;         // bad command line
inline constexpr int kExitIo = 3;            // a file or the state could not be read or written
inline constexpr int kExitStopped = 4;       // the job stopped before the end (paused, cancelled)

struct Verb {
  std::string_view name;
  std::string_view summary;
  std::string_view usage;                   // full --help text
  int (*run)(std::span<char* const> args);  // args exclude the program and verb names
};

// True when args contain -h or --help; prints the verb's usage to stdout.
bool WantsHelp(const Verb& verb, std::span<char* const> args);

int RunCid(std::span<char* const> args);
int RunValidate(std::span<char* const> args);
int RunCar(std::span<char* const> args);
int RunSyntax(std::span<char* const> args);
int RunDemo(std::span<char* const> args);
int RunIngest(std::span<char* const> args);
int RunBackfill(std::span<char* const> args);
int RunRun(std::span<char* const> args);
int RunStatus(std::span<char* const> args);
int RunJobs(std::span<char* const> args);
int RunJob(std::span<char* const> args);
int RunPause(std::span<char* const> args);
int RunResume(std::span<char* const> args);
int RunCancel(std::span<char* const> args);
int RunArchive(std::span<char* const> args);
int RunRetryFailed(std::span<char* const> args);
int RunVerify(std::span<char* const> args);

std::span<const Verb> Verbs();

}  // namespace atfill::cli
