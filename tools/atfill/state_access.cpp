#include "tools/atfill/state_access.hpp"

#include <unistd.h>
#include <fstream>

namespace atfill::cli {
namespace {

// Requests written before this process started were meant for an earlier holder of the state.
const std::filesystem::file_time_type kProcessStart = std::filesystem::file_time_type::clock::now();

void RemoveStaleRequests(const AppConfig& config) {
  std::error_code ec;
  const auto dir = std::filesystem::path(config.state.path) / "requests";
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

std::filesystem::path RequestPath(const AppConfig& config, uint64_t job, std::string_view what) {
  return std::filesystem::path(config.state.path) / "requests" /
         (std::to_string(job) + "." + std::string(what));
}

Status WriteRequest(const AppConfig& config, uint64_t job, std::string_view what) {
  const auto path = RequestPath(config, job, what);
  std::error_code ec;
  std::filesystem::create_directories(path.parent_path(), ec);
  if (ec)
    return Status::IoError("cannot create " + path.parent_path().string() + ": " + ec.message());
  const auto tmp = path.string() + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp);
    out << what << "\n";
    if (!out) return Status::IoError("cannot write " + tmp);
  }
  std::filesystem::rename(tmp, path, ec);
  if (ec) return Status::IoError("cannot write " + path.string() + ": " + ec.message());
  return Status::OK();
}

void ClearRequests(const AppConfig& config, uint64_t job) {
  std::error_code ec;
  std::filesystem::remove(RequestPath(config, job, "pause"), ec);
  std::filesystem::remove(RequestPath(config, job, "cancel"), ec);
}

}  // namespace atfill::cli
