#include "sources/crawl/host_scheduler.hpp"

#include <algorithm>

namespace atfill::sources {

HostScheduler::HostScheduler(HostSchedulerOptions options) : options_(std::move(options)) {}

bool HostScheduler::IsDidWeb(std::string_view did) { return did.rfind("did:web:", 0) == 0; }

void HostScheduler::Add(uint64_t unit, std::string_view did) {
  Unit& u = units_[unit];
  u.did = std::string(did);
  u.host.clear();
  PushWaiting(unit, u);
}

// A unit to resolve joins its DID, waiting or resolving; a DID not seen yet waits in arrival
// order.
void HostScheduler::PushWaiting(uint64_t position, Unit& u) {
  auto [it, inserted] = by_did_.try_emplace(u.did);
  it->second.units.push_back(position);
  if (it->second.resolving) {
    u.stage = Stage::kResolving;
    ++active_;
    return;
  }
  u.stage = Stage::kWaiting;
  if (inserted) (IsDidWeb(u.did) ? waiting_web_ : waiting_plc_).push_back(u.did);
}

std::vector<uint64_t> HostScheduler::Resolved(const std::string& did) {
  --(IsDidWeb(did) ? resolving_web_ : resolving_plc_);
  std::vector<uint64_t> out;
  auto entry = by_did_.find(did);
  if (entry == by_did_.end()) return out;
  for (uint64_t pos : entry->second.units) {
    if (units_.count(pos) != 0) out.push_back(pos);
  }
  by_did_.erase(entry);
  return out;
}

void HostScheduler::Ready(uint64_t unit, const std::string& host) {
  auto it = units_.find(unit);
  if (it == units_.end()) return;
  it->second.host = host;
  MakeReady(unit, it->second);
}

void HostScheduler::MakeReady(uint64_t position, Unit& u) {
  u.stage = Stage::kReady;
  Host& h = hosts_[u.host];
  if (!h.open && !h.ready.empty()) closed_ready_.erase({h.ready.size(), u.host});
  h.ready.push_back(position);
  if (!h.open) closed_ready_.emplace(h.ready.size(), u.host);
}

// The unit no longer holds a host slot.
void HostScheduler::ReleaseSlot(Unit& u) {
  if (u.stage != Stage::kFetching) return;
  auto it = hosts_.find(u.host);
  if (it != hosts_.end()) --it->second.fetching;
  --fetching_;
  u.stage = Stage::kDelayed;
}

void HostScheduler::Delay(uint64_t unit, int64_t due_ms) {
  auto it = units_.find(unit);
  if (it == units_.end()) return;
  ReleaseSlot(it->second);
  --active_;
  it->second.stage = Stage::kDelayed;
  delayed_.emplace(due_ms, unit);
}

void HostScheduler::Drop(uint64_t unit) {
  auto it = units_.find(unit);
  if (it == units_.end()) return;
  const Stage stage = it->second.stage;
  ReleaseSlot(it->second);
  if (stage != Stage::kWaiting && stage != Stage::kDelayed) --active_;
  units_.erase(it);
}

void HostScheduler::StartResolutions(std::deque<std::string>& waiting, size_t& resolving,
                                     size_t limit, SchedulerRequests* out) {
  while (resolving < limit && active_ < options_.max_active && !waiting.empty()) {
    std::string did = std::move(waiting.front());
    waiting.pop_front();
    auto it = by_did_.find(did);
    if (it == by_did_.end()) continue;
    it->second.resolving = true;
    for (uint64_t pos : it->second.units) {
      auto u = units_.find(pos);
      if (u == units_.end()) continue;
      u->second.stage = Stage::kResolving;
      ++active_;
    }
    ++resolving;
    out->resolve.push_back(std::move(did));
  }
}

void HostScheduler::CloseHost(const std::string& key) {
  auto it = hosts_.find(key);
  if (it == hosts_.end()) return;
  it->second.open = false;
  if (it->second.ready.empty()) {
    hosts_.erase(it);
  } else {
    closed_ready_.emplace(it->second.ready.size(), key);
  }
}

// Fills the open hosts' free slots from their ready queues, closes the hosts left with nothing,
// and opens the closed hosts with the most ready units while host slots are free.
void HostScheduler::Dispatch(bool listing, SchedulerRequests* out) {
  const auto max_total =
      static_cast<size_t>(std::max(1, options_.max_in_flight - (listing ? 1 : 0)));
  auto host_limit = [&](const std::string& key) {
    return options_.max_per_host - (listing && key == options_.relay_host ? 1 : 0);
  };
  auto fill = [&](const std::string& key, Host& h) {
    const int limit = host_limit(key);
    while (!h.ready.empty() && h.fetching < limit && fetching_ < max_total) {
      const uint64_t pos = h.ready.front();
      h.ready.pop_front();
      auto it = units_.find(pos);
      if (it == units_.end() || it->second.stage != Stage::kReady) continue;
      it->second.stage = Stage::kFetching;
      ++h.fetching;
      ++fetching_;
      out->fetch.push_back(pos);
    }
  };
  for (size_t i = 0; i < open_hosts_.size();) {
    auto it = hosts_.find(open_hosts_[i]);
    if (it != hosts_.end()) {
      fill(it->first, it->second);
      if (!it->second.ready.empty() || it->second.fetching > 0) {
        ++i;
        continue;
      }
    }
    CloseHost(open_hosts_[i]);
    open_hosts_[i] = std::move(open_hosts_.back());
    open_hosts_.pop_back();
  }
  // The relay's host takes a host slot of its own unless it is open as a PDS already.
  bool relay_open = false;
  if (listing) {
    auto it = hosts_.find(options_.relay_host);
    relay_open = it != hosts_.end() && it->second.open;
  }
  const auto max_hosts =
      static_cast<size_t>(std::max(1, options_.max_hosts - (listing && !relay_open ? 1 : 0)));
  std::vector<std::pair<size_t, std::string>> skipped;
  while (open_hosts_.size() < max_hosts && fetching_ < max_total && !closed_ready_.empty()) {
    auto top = closed_ready_.begin();
    std::pair<size_t, std::string> entry = *top;
    closed_ready_.erase(top);
    if (host_limit(entry.second) <= 0) {  // the relay's host with one slot, held by the listing
      skipped.push_back(std::move(entry));
      continue;
    }
    Host& h = hosts_[entry.second];
    h.open = true;
    open_hosts_.push_back(entry.second);
    fill(entry.second, h);
  }
  for (auto& entry : skipped) closed_ready_.insert(std::move(entry));
}

SchedulerRequests HostScheduler::Step(int64_t now_ms, bool listing_slot_needed) {
  SchedulerRequests out;
  while (!delayed_.empty() && delayed_.begin()->first <= now_ms) {
    const uint64_t pos = delayed_.begin()->second;
    delayed_.erase(delayed_.begin());
    auto it = units_.find(pos);
    if (it == units_.end() || it->second.stage != Stage::kDelayed) continue;
    Unit& u = it->second;
    if (!u.host.empty()) {
      ++active_;
      MakeReady(pos, u);
    } else {
      PushWaiting(pos, u);
    }
  }
  StartResolutions(waiting_plc_, resolving_plc_, options_.max_resolving_plc, &out);
  StartResolutions(waiting_web_, resolving_web_, options_.max_resolving_web, &out);
  Dispatch(listing_slot_needed, &out);
  return out;
}

}  // namespace atfill::sources
