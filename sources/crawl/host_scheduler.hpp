// The crawl's host scheduler: decides which DIDs to resolve and which units to fetch next, and
// does nothing else. It is a pure object: no I/O, no clock (callers pass the time), no state
// store. Units go in (by their queue position), requests come out of Step(); the caller makes the
// requests and reports each outcome back.
//
// The rules (the fetch client serves at most max_hosts hosts at once, max_per_host requests each,
// so units picked in queue order from hundreds of hosts would leave most of its slots idle):
// - Resolution runs ahead of fetching, once per DID for all of the DID's units (a DID with two
//   collections costs one resolution), up to max_resolving_plc DIDs of the PLC and
//   max_resolving_web did:web DIDs at once. Units that arrive while their DID waits or resolves
//   join it.
// - Resolved units wait in a ready queue per host. At most max_hosts hosts are open at once, each
//   with at most max_per_host units fetching, and at most max_in_flight units fetch in all; while a
//   listing runs or may start (it shares the fetch client) one slot of the relay's host and one of
//   the totals are left to it. A unit keeps its host slot until the caller releases it (a unit
//   paging through listRecords keeps it for all its pages). A host with nothing ready and nothing
//   fetching closes; the closed host with the most ready units opens in its place.
// - max_active bounds the units resolving, ready or fetching at once (the lookahead); a DID's
//   resolution starts only while fewer are active.
// - A delayed unit (a retry) comes back when its time has come: to its host's ready queue when it
//   has a host (its DID stays resolved), to resolution otherwise.
//
// Threading: not thread-safe; one caller (the crawl's reading thread).
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace atfill::sources {

struct HostSchedulerOptions {
  // Units resolving, ready or fetching at once; at least 1.
  size_t max_active = 1;
  // DIDs resolving at once through the PLC directory and through did:web hosts; at least 1.
  size_t max_resolving_plc = 1;
  size_t max_resolving_web = 1;
  // The fetch client's limits: hosts open at once, units fetching per host and in all.
  int max_hosts = 1;
  int max_per_host = 1;
  int max_in_flight = 1;
  // The host key the listings use (they share the fetch client); empty when nothing is listed.
  std::string relay_host;
};

// What Step() asks the caller to start, in this order.
struct SchedulerRequests {
  std::vector<std::string> resolve;  // DIDs to resolve, each once
  std::vector<uint64_t> fetch;       // units to fetch, each now holding a slot of its host
};

class HostScheduler {
 public:
  explicit HostScheduler(HostSchedulerOptions options);

  // A unit whose DID needs resolving: a new one, or one whose resolution is to be tried again.
  // `unit` must not be scheduled already.
  void Add(uint64_t unit, std::string_view did);

  // The resolution of `did` (started by Step) ended: returns its units, which stay active until
  // the caller makes each Ready, Delays it or Drops it.
  std::vector<uint64_t> Resolved(const std::string& did);

  // A unit whose DID resolved to `host` waits in that host's ready queue.
  void Ready(uint64_t unit, const std::string& host);

  // The unit is to be tried again at `due_ms` (the caller's clock, as passed to Step); it gives up
  // its host slot and no longer counts as active meanwhile. It keeps its host, if it has one.
  void Delay(uint64_t unit, int64_t due_ms);

  // The unit leaves the scheduler (it finished, or is left for another run): its host slot and
  // its place in the lookahead are free again.
  void Drop(uint64_t unit);

  // Brings back the delayed units due at `now_ms`, starts resolutions while slots and the
  // lookahead allow, and hands out fetch slots. `listing_slot_needed`: a listing runs or may start,
  // so one slot of the relay's host and one of the totals are kept for it.
  SchedulerRequests Step(int64_t now_ms, bool listing_slot_needed);

  // Units resolving, ready or fetching.
  size_t active() const { return active_; }
  // Units holding a host slot.
  size_t fetching() const { return fetching_; }
  // Units known to the scheduler (waiting, delayed or active).
  size_t size() const { return units_.size(); }
  // Hosts open now.
  size_t open_hosts() const { return open_hosts_.size(); }

 private:
  enum class Stage : uint8_t { kWaiting, kResolving, kReady, kFetching, kDelayed };
  struct Unit {
    std::string did;
    std::string host;  // once resolved
    Stage stage = Stage::kWaiting;
  };
  struct DidUnits {
    std::vector<uint64_t> units;
    bool resolving = false;
  };
  struct Host {
    std::deque<uint64_t> ready;
    int fetching = 0;
    bool open = false;
  };

  static bool IsDidWeb(std::string_view did);
  void PushWaiting(uint64_t position, Unit& u);
  void StartResolutions(std::deque<std::string>& waiting, size_t& resolving, size_t limit,
                        SchedulerRequests* out);
  void MakeReady(uint64_t position, Unit& u);
  void ReleaseSlot(Unit& u);
  void CloseHost(const std::string& key);
  void Dispatch(bool listing, SchedulerRequests* out);

  const HostSchedulerOptions options_;
  std::unordered_map<uint64_t, Unit> units_;
  std::multimap<int64_t, uint64_t> delayed_;  // due ms -> unit
  size_t active_ = 0;

  std::unordered_map<std::string, DidUnits> by_did_;   // DIDs waiting or resolving
  std::deque<std::string> waiting_plc_, waiting_web_;  // DIDs to resolve, in arrival order
  size_t resolving_plc_ = 0, resolving_web_ = 0;

  std::unordered_map<std::string, Host> hosts_;  // hosts with ready or fetching units
  // Closed hosts with ready units, by ready count, most first.
  std::set<std::pair<size_t, std::string>, std::greater<>> closed_ready_;
  std::vector<std::string> open_hosts_;
  size_t fetching_ = 0;
};

}  // namespace atfill::sources
