#include "tests/common/peers.hpp"
#include "base/low_port.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <simdjson.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <utility>

#include "tests/common/process.hpp"

namespace atfill::testing {
namespace {

namespace fs = std::filesystem;
using std::chrono::milliseconds;
using std::chrono::minutes;
using std::chrono::seconds;

// A cold install runs npm ci and compiles better-sqlite3 (~2 min on 2 idle cores).
constexpr milliseconds kInstallTimeout = minutes(30);
// Start (health waits are bounded by START_TIMEOUT=60 s in start.sh) plus seeding.
constexpr milliseconds kUpTimeout = minutes(10);
// stop.sh escalates to SIGKILL after 10 s per process.
constexpr milliseconds kDownTimeout = seconds(60);
// Attempts at `up` when a port picked as free was taken before the peers bound it.
constexpr int kUpAttempts = 3;
constexpr size_t kTailLines = 30;

std::atomic<int> g_network_counter{0};

// ---- the manifest -----------------------------------------------------------------------------

Status Bad(const std::string& path, std::string_view why) {
  return Status::Invalid("peer manifest: " + path + ": " + std::string(why));
}

Status GetObject(simdjson::dom::object parent, std::string_view key, const std::string& path,
                 simdjson::dom::object* out) {
  if (parent[key].get_object().get(*out) != simdjson::SUCCESS) {
    return Bad(path, "missing or not an object");
  }
  return Status::OK();
}

Status GetArray(simdjson::dom::object parent, std::string_view key, const std::string& path,
                simdjson::dom::array* out) {
  if (parent[key].get_array().get(*out) != simdjson::SUCCESS) {
    return Bad(path, "missing or not an array");
  }
  return Status::OK();
}

Status GetString(simdjson::dom::object parent, std::string_view key, const std::string& path,
                 std::string* out) {
  std::string_view value;
  if (parent[key].get_string().get(value) != simdjson::SUCCESS) {
    return Bad(path, "missing or not a string");
  }
  *out = std::string(value);
  return Status::OK();
}

Status GetStrings(simdjson::dom::object parent, std::string_view key, const std::string& path,
                  std::vector<std::string>* out) {
  simdjson::dom::array array;
  ATFILL_RETURN_IF_ERROR(GetArray(parent, key, path, &array));
  size_t i = 0;
  for (simdjson::dom::element item : array) {
    std::string_view value;
    if (item.get_string().get(value) != simdjson::SUCCESS) {
      return Bad(path + "[" + std::to_string(i) + "]", "not a string");
    }
    out->emplace_back(value);
    ++i;
  }
  return Status::OK();
}

Status ParseRecord(simdjson::dom::element element, const std::string& path, PeerRecord* out) {
  simdjson::dom::object item;
  if (element.get_object().get(item) != simdjson::SUCCESS) return Bad(path, "not an object");
  ATFILL_RETURN_IF_ERROR(GetString(item, "uri", path + ".uri", &out->uri));
  ATFILL_RETURN_IF_ERROR(GetString(item, "collection", path + ".collection", &out->collection));
  ATFILL_RETURN_IF_ERROR(GetString(item, "rkey", path + ".rkey", &out->rkey));
  ATFILL_RETURN_IF_ERROR(GetString(item, "cid", path + ".cid", &out->cid));
  simdjson::dom::object value;
  ATFILL_RETURN_IF_ERROR(GetObject(item, "value", path + ".value", &value));
  out->value_json = simdjson::minify(value);
  return Status::OK();
}

Status ParseAccount(simdjson::dom::element element, const std::string& path, PeerAccount* out) {
  simdjson::dom::object item;
  if (element.get_object().get(item) != simdjson::SUCCESS) return Bad(path, "not an object");
  ATFILL_RETURN_IF_ERROR(GetString(item, "did", path + ".did", &out->did));
  ATFILL_RETURN_IF_ERROR(GetString(item, "handle", path + ".handle", &out->handle));
  ATFILL_RETURN_IF_ERROR(GetString(item, "pdsUrl", path + ".pdsUrl", &out->pds_url));
  simdjson::dom::object head;
  ATFILL_RETURN_IF_ERROR(GetObject(item, "head", path + ".head", &head));
  ATFILL_RETURN_IF_ERROR(GetString(head, "cid", path + ".head.cid", &out->head_cid));
  ATFILL_RETURN_IF_ERROR(GetString(head, "rev", path + ".head.rev", &out->head_rev));
  simdjson::dom::object status;
  ATFILL_RETURN_IF_ERROR(GetObject(item, "status", path + ".status", &status));
  if (status["active"].get_bool().get(out->active) != simdjson::SUCCESS) {
    return Bad(path + ".status.active", "missing or not a boolean");
  }
  simdjson::dom::element status_name;
  if (status["status"].get(status_name) == simdjson::SUCCESS) {
    ATFILL_RETURN_IF_ERROR(GetString(status, "status", path + ".status.status", &out->status));
  }
  simdjson::dom::array records;
  ATFILL_RETURN_IF_ERROR(GetArray(item, "records", path + ".records", &records));
  size_t i = 0;
  for (simdjson::dom::element record : records) {
    out->records.emplace_back();
    ATFILL_RETURN_IF_ERROR(
        ParseRecord(record, path + ".records[" + std::to_string(i) + "]", &out->records.back()));
    ++i;
  }
  return GetStrings(item, "deleted", path + ".deleted", &out->deleted);
}

// ---- processes and files ----------------------------------------------------------------------

std::string Join(const std::vector<std::string>& argv) {
  std::string out;
  for (const std::string& a : argv) {
    if (!out.empty()) out += ' ';
    out += a;
  }
  return out;
}

// The last `lines` lines of `text`.
std::string Tail(std::string_view text, size_t lines) {
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.remove_suffix(1);
  size_t begin = 0;
  size_t pos = text.size();
  for (size_t n = 0; n < lines && pos > 0; ++n) {
    const size_t nl = text.rfind('\n', pos - 1);
    if (nl == std::string_view::npos) {
      begin = 0;
      break;
    }
    begin = nl + 1;
    pos = nl;
  }
  return std::string(text.substr(begin));
}

// Runs `argv` (its output files go to `dir`); an error names the command, how it ended and the
// tail of its stderr (of its stdout when stderr is empty).
Status Run(const std::vector<std::string>& argv, const fs::path& dir, milliseconds timeout,
           ProcessResult* result) {
  *result = RunProcess(argv, dir, timeout);
  if (result->exit_code == 0 && result->signal == 0) return Status::OK();
  std::string how = result->signal != 0 ? "was ended by signal " + std::to_string(result->signal)
                                        : "exited with code " + std::to_string(result->exit_code);
  const bool use_err = result->err.find_first_not_of(" \t\r\n") != std::string::npos;
  return Status::Unavailable("`" + Join(argv) + "` " + how + "; tail of its " +
                             (use_err ? "stderr" : "stdout") + ":\n" +
                             Tail(use_err ? result->err : result->out, kTailLines));
}

Result<std::string> ReadFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::IoError("cannot open " + path.string() + ": " + std::strerror(errno));
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// KEY=value lines; the last assignment of a key wins.
std::map<std::string, std::string> ParseEnvFile(std::string_view text) {
  std::map<std::string, std::string> out;
  while (!text.empty()) {
    const size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text = nl == std::string_view::npos ? std::string_view() : text.substr(nl + 1);
    const size_t eq = line.find('=');
    if (eq == std::string_view::npos || eq == 0) continue;
    out[std::string(line.substr(0, eq))] = std::string(line.substr(eq + 1));
  }
  return out;
}

// Two distinct TCP ports that were free on 127.0.0.1 a moment ago.
Result<std::pair<int, int>> TwoFreePorts() {
  int fds[2] = {-1, -1};
  int ports[2] = {0, 0};
  Status status;
  for (int i = 0; i < 2 && status.ok(); ++i) {
    fds[i] = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    // Below the ephemeral range (base/low_port.hpp): the peers bind the port after this probe
    // closes, and a client socket could take an ephemeral one meanwhile.
    const auto port = fds[i] < 0 ? std::nullopt : BindLowPort([&](uint16_t candidate) {
      sockaddr_in addr{};
      addr.sin_family = AF_INET;
      addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      addr.sin_port = htons(candidate);
      return ::bind(fds[i], reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
    });
    if (!port) {
      status = Status::IoError(std::string("cannot find a free port on 127.0.0.1 below 32768: ") +
                               std::strerror(errno));
    } else {
      ports[i] = *port;
    }
  }
  for (int fd : fds) {
    if (fd >= 0) ::close(fd);
  }
  if (!status.ok()) return status;
  return std::make_pair(ports[0], ports[1]);
}

bool ProcessAlive(pid_t pid) { return ::kill(pid, 0) == 0 || errno == EPERM; }

// Stops and removes the networks under `home` whose test process has exited (their folders are
// named net-<pid>-<n>). network.sh down signals only the PIDs that network recorded.
void StopOrphans(const fs::path& home, const fs::path& script) {
  std::error_code ec;
  std::vector<fs::path> orphans;
  for (const fs::directory_entry& entry : fs::directory_iterator(home, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("net-", 0) != 0 || !entry.is_directory(ec) || entry.is_symlink(ec)) continue;
    pid_t pid = 0;
    const char* first = name.data() + 4;
    const auto [end, err] = std::from_chars(first, name.data() + name.size(), pid);
    if (err != std::errc() || end == first || pid <= 0) continue;
    if (pid == ::getpid() || ProcessAlive(pid)) continue;
    orphans.push_back(entry.path());
  }
  for (const fs::path& dir : orphans) {
    ProcessResult result;
    const Status down = Run({script.string(), "down", dir.string()}, dir, kDownTimeout, &result);
    if (down.ok()) {
      fs::remove_all(dir, ec);
    } else {
      std::fprintf(stderr, "peers: could not stop the orphaned network in %s: %s\n", dir.c_str(),
                   down.ToString().c_str());
    }
  }
}

}  // namespace

Result<PeerManifest> ParsePeerManifest(std::string_view json) {
  simdjson::dom::parser parser;
  const simdjson::padded_string padded(json);
  simdjson::dom::element doc;
  if (const auto error = parser.parse(padded).get(doc); error != simdjson::SUCCESS) {
    return Status::Invalid(std::string("peer manifest: not JSON: ") +
                           simdjson::error_message(error));
  }
  simdjson::dom::object root;
  if (doc.get_object().get(root) != simdjson::SUCCESS) return Bad("(root)", "not an object");
  PeerManifest out;
  simdjson::dom::object pds, plc, totals;
  ATFILL_RETURN_IF_ERROR(GetObject(root, "pds", "pds", &pds));
  ATFILL_RETURN_IF_ERROR(GetString(pds, "url", "pds.url", &out.pds_url));
  ATFILL_RETURN_IF_ERROR(GetString(pds, "did", "pds.did", &out.pds_did));
  ATFILL_RETURN_IF_ERROR(GetObject(root, "plc", "plc", &plc));
  ATFILL_RETURN_IF_ERROR(GetString(plc, "url", "plc.url", &out.plc_url));
  ATFILL_RETURN_IF_ERROR(GetObject(root, "totals", "totals", &totals));
  uint64_t live = 0;
  if (totals["liveRecords"].get_uint64().get(live) != simdjson::SUCCESS) {
    return Bad("totals.liveRecords", "missing or not a non-negative integer");
  }
  out.live_records = static_cast<size_t>(live);
  simdjson::dom::array accounts;
  ATFILL_RETURN_IF_ERROR(GetArray(root, "accounts", "accounts", &accounts));
  size_t i = 0;
  for (simdjson::dom::element account : accounts) {
    out.accounts.emplace_back();
    ATFILL_RETURN_IF_ERROR(
        ParseAccount(account, "accounts[" + std::to_string(i) + "]", &out.accounts.back()));
    ++i;
  }
  ATFILL_RETURN_IF_ERROR(GetStrings(root, "deleted", "deleted", &out.deleted));
  return out;
}

Result<std::unique_ptr<PeerNetwork>> PeerNetwork::Up(const std::string& shared_dir,
                                                     const std::string& home,
                                                     const std::vector<std::string>& seed_args) {
  const fs::path harness = fs::path(shared_dir) / "peers";
  const fs::path script = harness / "network.sh";
  const fs::path install = harness / "install.sh";
  if (::access(script.c_str(), X_OK) != 0 || ::access(install.c_str(), X_OK) != 0) {
    return Status::NotFound("the peers harness is missing: " + script.string() + " and " +
                            install.string() + " must exist and be executable");
  }
  std::error_code ec;
  fs::create_directories(home, ec);
  const fs::path home_dir = fs::absolute(home, ec);
  if (ec || !fs::is_directory(home_dir)) {
    return Status::IoError("cannot create the peers home " + home + ": " + ec.message());
  }
  StopOrphans(home_dir, script);

  const fs::path net_dir = home_dir / ("net-" + std::to_string(::getpid()) + "-" +
                                       std::to_string(g_network_counter.fetch_add(1)));
  fs::remove_all(net_dir, ec);
  if (!fs::create_directories(net_dir, ec)) {
    return Status::IoError("cannot create " + net_dir.string() + ": " + ec.message());
  }

  // The install is shared by every network under `home` (install.sh serialises concurrent runs
  // with flock and finds an up-to-date install in well under a second).
  ProcessResult result;
  ATFILL_RETURN_IF_ERROR(
      Run({install.string(), home_dir.string()}, net_dir, kInstallTimeout, &result));
  fs::create_directory_symlink("../node_modules", net_dir / "node_modules", ec);
  if (ec) {
    return Status::IoError("cannot link " + (net_dir / "node_modules").string() + ": " +
                           ec.message());
  }

  Status up;
  for (int attempt = 1; attempt <= kUpAttempts; ++attempt) {
    ATFILL_ASSIGN_OR_RETURN(const auto ports, TwoFreePorts());
    std::vector<std::string> argv = {"/usr/bin/env",
                                     "PLC_PORT=" + std::to_string(ports.first),
                                     "PDS_PORT=" + std::to_string(ports.second),
                                     script.string(),
                                     "up",
                                     net_dir.string()};
    argv.insert(argv.end(), seed_args.begin(), seed_args.end());
    up = Run(argv, net_dir, kUpTimeout, &result);
    // Another process may take a port between TwoFreePorts() and start.sh's check.
    if (up.ok() || result.err.find("is already in use") == std::string::npos) break;
  }
  if (!up.ok())
    return up.WithContext("the peers did not come up (logs in " + (net_dir / "run").string() + ")");

  std::unique_ptr<PeerNetwork> net(new PeerNetwork());
  net->script_ = script.string();
  net->peers_home_ = net_dir.string();
  // From here on a failure stops the running peers (Down() on the way out).
  auto fail = [&net](Status status) -> Status {
    const Status down = net->Down();
    if (!down.ok())
      return status.WithContext("and stopping the peers failed too: " + down.ToString());
    return status;
  };

  const fs::path env_path = net_dir / "run" / "urls.env";
  const std::string printed = Tail(result.out, 1);
  if (fs::path(printed) != env_path) {
    return fail(
        Status::Internal("network.sh up printed '" + printed + "', expected " + env_path.string()));
  }
  Result<std::string> env_text = ReadFile(env_path);
  if (!env_text.ok()) return fail(env_text.status());
  const std::map<std::string, std::string> env = ParseEnvFile(*env_text);
  const std::pair<const char*, std::string*> wanted[] = {
      {"PLC_URL", &net->plc_url_},        {"PDS_URL", &net->pds_url_},
      {"PLC_URL_IP", &net->plc_url_ip_},  {"PDS_URL_IP", &net->pds_url_ip_},
      {"MANIFEST", &net->manifest_path_}, {"PEERS_NODE", &net->node_}};
  for (const auto& [key, field] : wanted) {
    const auto it = env.find(key);
    if (it == env.end() || it->second.empty()) {
      return fail(Status::Invalid(env_path.string() + " has no " + key));
    }
    *field = it->second;
  }
  Result<std::string> manifest_text = ReadFile(net->manifest_path_);
  if (!manifest_text.ok()) return fail(manifest_text.status());
  Result<PeerManifest> manifest = ParsePeerManifest(*manifest_text);
  if (!manifest.ok()) return fail(manifest.status().WithContext(net->manifest_path_));
  net->manifest_ = std::move(*manifest);
  return net;
}

Status PeerNetwork::Down() {
  if (down_) return down_status_;
  down_ = true;
  ProcessResult result;
  down_status_ = Run({script_, "down", peers_home_}, peers_home_, kDownTimeout, &result);
  if (!down_status_.ok()) return down_status_;
  std::error_code ec;
  fs::remove_all(peers_home_, ec);
  if (ec) down_status_ = Status::IoError("cannot remove " + peers_home_ + ": " + ec.message());
  return down_status_;
}

PeerNetwork::~PeerNetwork() {
  if (down_) return;
  const Status status = Down();
  if (!status.ok()) {
    std::fprintf(stderr, "peers: stopping the network in %s failed: %s\n", peers_home_.c_str(),
                 status.ToString().c_str());
  }
}

}  // namespace atfill::testing
