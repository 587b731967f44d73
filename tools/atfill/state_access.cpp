#include "tools/atfill/state_access.hpp"

namespace atfill::cli {
namespace {

// Requests written before this process started were meant for an earlier holder of the state.
const std::filesystem::file_time_type kProcessStart = std::filesystem::file_time_type::clock::now();

void RemoveStaleRequests(const AppConfig& config) {
  std::error_code ec;
  const auto dir = RequestsDir(config);
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    std::error_code entry_ec;
    const auto written = entry.last_write_time(entry_ec);
    if (!entry_ec && written < kProcessStart) std::filesystem::remove(entry.path(), entry_ec);
  }
}

OpenedState Wrap(std::unique_ptr<state::KvStore> kv, const AppConfig& config, bool read_only) {
  OpenedState s;
  s.kv = std::move(kv);
  s.jobs = std::make_unique<state::JobStore>(*s.kv);
  s.errors = std::make_unique<state::ErrorLog>(*s.kv, config.error_log);
  s.tombstones = std::make_unique<state::Tombstones>(*s.kv, config.tombstones);
  s.read_only = read_only;
  return s;
}

}  // namespace

Result<OpenedState> OpenStateForWrite(const AppConfig& config) {
  ATFILL_ASSIGN_OR_RETURN(auto kv, state::OpenRocksDb(config.state));
  // A state directory belongs to one shard: its queue, cursors and live position are that
  // shard's. The first process to write it records its shard; another shard is refused.
  constexpr std::string_view kShardKey = "shard";
  ATFILL_ASSIGN_OR_RETURN(auto recorded, kv->Get(state::Family::kMeta, kShardKey));
  const std::string shard = config.shard.ToString();
  if (!recorded) {
    state::WriteBatch b;
    b.Put(state::Family::kMeta, kShardKey, shard);
    ATFILL_RETURN_IF_ERROR(kv->Write(b));
  } else if (*recorded != shard) {
    return Status::Invalid("the state directory " + config.state.path + " belongs to shard " +
                           *recorded + ", and this process is shard " + shard +
                           " ([engine] shard or --shard): each shard needs its own state directory "
                           "([state] dir)");
  }
  // Now that this process holds the state, a request written from here on is for it, even one
  // that arrives before its job starts; only older ones are dropped.
  RemoveStaleRequests(config);
  return Wrap(std::move(kv), config, false);
}

Result<OpenedState> OpenStateForRead(const AppConfig& config) {
  auto kv = state::OpenRocksDb(config.state);
  if (kv.ok()) return Wrap(std::move(*kv), config, false);
  if (kv.status().code() != StatusCode::kUnavailable) return kv.status();
  ATFILL_ASSIGN_OR_RETURN(auto view, state::OpenRocksDbReadOnly(config.state));
  return Wrap(std::move(view), config, true);
}

std::filesystem::path RequestsDir(const AppConfig& config) {
  return std::filesystem::path(config.state.path) / "requests";
}

}  // namespace atfill::cli
