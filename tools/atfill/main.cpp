#include <cstdio>
#include <string_view>
#include <vector>

#include "base/version.hpp"
#include "pipeline/engine.hpp"
#include "pipeline/shard.hpp"
#include "sinks/sqlite_sink.hpp"
#include "state/kv_store.hpp"
#include "tools/atfill/app_config.hpp"
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

// The libraries' versions are the ones loaded at run time (a Debian update of libsqlite3-0 shows
// here without a rebuild).
void PrintVersion() {
  const std::string_view build_type = atfill::kBuildType.empty() ? "none" : atfill::kBuildType;
  std::printf("atfill %s\n", ATFILL_VERSION);
  std::printf("build type: %.*s\n", static_cast<int>(build_type.size()), build_type.data());
  std::printf("SQLite %s\n", atfill::sinks::SqliteVersion().c_str());
  std::printf("RocksDB %s\n", atfill::state::RocksDbVersion().c_str());
  std::printf("oneTBB %s\n", atfill::pipeline::TbbRuntimeVersion().c_str());
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
    PrintVersion();
    return atfill::cli::kExitOk;
  }
  for (const auto& verb : atfill::cli::Verbs()) {
    if (verb.name != name) continue;
    std::span<char* const> all(argv + 2, static_cast<size_t>(argc - 2));
    if (atfill::cli::WantsHelp(verb, all)) return atfill::cli::kExitOk;
    // --shard i/n works with every verb: it replaces [engine] shard for this process.
    std::vector<char*> args;
    for (size_t i = 0; i < all.size(); ++i) {
      if (std::string_view(all[i]) != "--shard") {
        args.push_back(all[i]);
        continue;
      }
      if (i + 1 >= all.size()) {
        std::fprintf(stderr, "atfill %s: --shard needs a value (i/n)\n", argv[1]);
        return atfill::cli::kExitUsage;
      }
      auto shard = atfill::pipeline::Shard::Parse(all[++i]);
      if (!shard.ok()) {
        std::fprintf(stderr, "atfill %s: --shard: %s\n", argv[1], shard.status().message().c_str());
        return atfill::cli::kExitUsage;
      }
      atfill::cli::SetShardOverride(*shard);
    }
    return verb.run(args);
  }
  std::fprintf(stderr, "atfill: unknown verb '%s' (atfill --help lists them)\n", argv[1]);
  return atfill::cli::kExitUsage;
}
