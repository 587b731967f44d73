#include <cstdio>
#include <string_view>

#include "tools/atfill/cli.hpp"

namespace {

void PrintOverview() {
  std::printf("atfill: backfill and live-index AT Protocol records into a database\n\n");
  std::printf("usage: atfill VERB [ARGS...]   (atfill VERB --help for details)\n\nverbs:\n");
  for (const auto& verb : atfill::cli::Verbs()) {
    std::printf("  %-10.*s %.*s\n", static_cast<int>(verb.name.size()), verb.name.data(),
                static_cast<int>(verb.summary.size()), verb.summary.data());
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    PrintOverview();
    return atfill::cli::kExitUsage;
  }
  const std::string_view name = argv[1];
  if (name == "-h" || name == "--help" || name == "help") {
    PrintOverview();
    return atfill::cli::kExitOk;
  }
  if (name == "--version") {
    std::printf("atfill %s\n", ATFILL_VERSION);
    return atfill::cli::kExitOk;
  }
  for (const auto& verb : atfill::cli::Verbs()) {
    if (verb.name != name) continue;
    std::span<char* const> args(argv + 2, static_cast<size_t>(argc - 2));
    if (atfill::cli::WantsHelp(verb, args)) return atfill::cli::kExitOk;
    return verb.run(args);
  }
  std::fprintf(stderr, "atfill: unknown verb '%s' (atfill --help lists them)\n", argv[1]);
  return atfill::cli::kExitUsage;
}
