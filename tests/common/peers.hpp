// The reference atproto peers (a PLC directory and the reference PDS, from ../shared/peers) as a
// test fixture: brought up on free loopback ports, seeded, and described by the seeder's
// ground-truth manifest.
//
// Layout under `home` (a folder under the build dir):
//   home/node_modules, home/*.mjs ...   the harness install (install.sh home): npm ci and the
//                                       better-sqlite3 build, done once and reused (~2 min cold)
//   home/net-<pid>-<n>/                 one network's PEERS_HOME: node_modules is a symlink to
//                                       home/node_modules; data/ (manifest.json), run/ (logs,
//                                       pids, urls.env). Removed after a clean Down(); kept
//                                       after a failed Up() or Down() for its logs.
// Every network has its own PEERS_HOME and ports, so test processes running at once (ctest -j)
// do not clash. Folders left behind by test processes that have exited (crashed, killed, or a
// failed Up()) are stopped with network.sh down and removed by the next Up() on the same home.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.hpp"
#include "tests/common/test_util.hpp"

namespace atfill::testing {

struct PeerRecord {
  std::string uri, collection, rkey, cid;
  // The manifest's value as compact JSON text (simdjson's serialisation: same members and order,
  // integers exact, strings re-escaped).
  std::string value_json;
};

struct PeerAccount {
  std::string did, handle, pds_url;
  bool active = true;
  std::string status;  // "" when active, else "deactivated" or "takendown"
  std::string head_rev, head_cid;
  std::vector<PeerRecord> records;   // live records, by collection then rkey
  std::vector<std::string> deleted;  // at:// URIs of deleted records
};

struct PeerManifest {
  std::string pds_url, plc_url, pds_did;
  std::vector<PeerAccount> accounts;
  std::vector<std::string> deleted;  // at:// URIs of every deleted record
  size_t live_records = 0;           // totals.liveRecords
};

// Parses the seeder's manifest.json. Invalid, naming the member (as in
// "accounts[2].records[0].cid") and the reason, when the text is not JSON or a member is missing or
// of the wrong type.
Result<PeerManifest> ParsePeerManifest(std::string_view json);

// One running network. Not copyable; the destructor runs Down() unless it already ran.
class PeerNetwork {
 public:
  // Installs the harness into `home` when needed (install.sh; a no-op when up to date), then runs
  // `network.sh up <seed_args>` in a fresh PEERS_HOME under `home` on two free ports, and parses
  // run/urls.env and the manifest. `shared_dir` is the third-party folder (SharedDir()); the
  // harness is shared_dir/peers. Any failure is an error naming the command, its exit code (or
  // signal) and the tail of its stderr; whatever was started is stopped again.
  static Result<std::unique_ptr<PeerNetwork>> Up(const std::string& shared_dir,
                                                 const std::string& home,
                                                 const std::vector<std::string>& seed_args);

  ~PeerNetwork();
  PeerNetwork(const PeerNetwork&) = delete;
  PeerNetwork& operator=(const PeerNetwork&) = delete;

  // network.sh down, then removes this network's PEERS_HOME. Idempotent: later calls return the
  // first call's outcome. On failure the folder is kept for its logs (run/pds.log, run/plc.log).
  Status Down();

  const PeerManifest& manifest() const { return manifest_; }
  // As the DID documents and the PDS name them: http://localhost:PORT (the servers listen on
  // 127.0.0.1 only, so a client must not insist on ::1).
  std::string plc_url() const { return plc_url_; }
  std::string pds_url() const { return pds_url_; }
  // The same servers as http://127.0.0.1:PORT.
  std::string plc_url_ip() const { return plc_url_ip_; }
  std::string pds_url_ip() const { return pds_url_ip_; }
  std::string manifest_path() const { return manifest_path_; }
  // This network's PEERS_HOME (run/ holds pds.log and plc.log).
  std::string peers_home() const { return peers_home_; }
  // The node binary the peers run on, for the harness's verify-car.mjs and firehose.mjs (run
  // those from peers_home(), with PEERS_HOME=peers_home() in their environment).
  std::string node() const { return node_; }

 private:
  PeerNetwork() = default;

  std::string script_;  // shared_dir/peers/network.sh
  std::string peers_home_;
  std::string plc_url_, pds_url_, plc_url_ip_, pds_url_ip_, manifest_path_, node_;
  PeerManifest manifest_;
  bool down_ = false;
  Status down_status_;
};

}  // namespace atfill::testing

// In a test body: brings up a network seeded with `seed_args` in ATFILL_PEERS_HOME (the test
// program's compile definition) and names it `var` (a PeerNetwork&), or ends the test: as
// ATFILL_SHARED_PATH says when ../shared/peers is missing, a failure naming the reason when Up
// fails.
#define ATFILL_PEERS_UP(var, seed_args)                                           \
  ATFILL_SHARED_PATH(var##_harness, "peers/network.sh");                          \
  ::atfill::Result<std::unique_ptr<::atfill::testing::PeerNetwork>> var##_up =    \
      ::atfill::testing::PeerNetwork::Up(::atfill::testing::SharedDir().string(), \
                                         ATFILL_PEERS_HOME, (seed_args));         \
  ASSERT_TRUE(var##_up.ok()) << var##_up.status().ToString();                     \
  ::atfill::testing::PeerNetwork& var = **var##_up
