// The crawl's host scheduler alone: units in, resolutions and fetches out, with the caller's
// clock. No network, no state store.
#include "sources/crawl/host_scheduler.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace atfill::sources {
namespace {

using ::testing::ElementsAre;
using ::testing::UnorderedElementsAre;

HostSchedulerOptions Wide() {
  HostSchedulerOptions o;
  o.max_active = 1000;
  o.max_resolving_plc = 100;
  o.max_resolving_web = 100;
  o.max_hosts = 100;
  o.max_per_host = 100;
  o.max_in_flight = 1000;
  return o;
}

// Resolves `did` and makes each of its units ready on `host`.
std::vector<uint64_t> ResolveTo(HostScheduler& s, const std::string& did, const std::string& host) {
  std::vector<uint64_t> units = s.Resolved(did);
  for (uint64_t u : units) s.Ready(u, host);
  return units;
}

// The units fetched per host in one Step.
std::map<std::string, int> PerHost(const std::vector<uint64_t>& fetched,
                                   const std::map<uint64_t, std::string>& host_of) {
  std::map<std::string, int> out;
  for (uint64_t u : fetched) ++out[host_of.at(u)];
  return out;
}

TEST(HostSchedulerTest, ADidIsResolvedOnceForAllOfItsUnits) {
  HostScheduler s(Wide());
  s.Add(1, "did:plc:a");
  s.Add(2, "did:plc:a");
  s.Add(3, "did:plc:b");
  SchedulerRequests r = s.Step(0, false);
  EXPECT_THAT(r.resolve, ElementsAre("did:plc:a", "did:plc:b"));
  EXPECT_TRUE(r.fetch.empty());
  EXPECT_EQ(s.active(), 3u);
  // A unit arriving while its DID resolves joins that resolution.
  s.Add(4, "did:plc:a");
  EXPECT_TRUE(s.Step(0, false).resolve.empty());
  EXPECT_EQ(s.active(), 4u);
  EXPECT_THAT(s.Resolved("did:plc:a"), UnorderedElementsAre(1u, 2u, 4u));
}

TEST(HostSchedulerTest, PlcAndDidWebResolutionsHaveTheirOwnLimits) {
  HostSchedulerOptions o = Wide();
  o.max_resolving_plc = 2;
  o.max_resolving_web = 1;
  HostScheduler s(o);
  s.Add(1, "did:plc:a");
  s.Add(2, "did:plc:b");
  s.Add(3, "did:plc:c");
  s.Add(4, "did:web:x.example");
  s.Add(5, "did:web:y.example");
  EXPECT_THAT(s.Step(0, false).resolve, ElementsAre("did:plc:a", "did:plc:b", "did:web:x.example"));
  EXPECT_TRUE(s.Step(0, false).resolve.empty());
  ResolveTo(s, "did:plc:a", "pds");
  EXPECT_THAT(s.Step(0, false).resolve, ElementsAre("did:plc:c"));
  ResolveTo(s, "did:web:x.example", "pds");
  EXPECT_THAT(s.Step(0, false).resolve, ElementsAre("did:web:y.example"));
}

TEST(HostSchedulerTest, TheLookaheadBoundsTheActiveUnits) {
  HostSchedulerOptions o = Wide();
  o.max_active = 2;
  HostScheduler s(o);
  s.Add(1, "did:plc:a");
  s.Add(2, "did:plc:b");
  s.Add(3, "did:plc:c");
  EXPECT_THAT(s.Step(0, false).resolve, ElementsAre("did:plc:a", "did:plc:b"));
  EXPECT_EQ(s.active(), 2u);
  // Ready and fetching units still count; only a dropped one frees its place.
  ResolveTo(s, "did:plc:a", "pds");
  EXPECT_THAT(s.Step(0, false).fetch, ElementsAre(1u));
  EXPECT_TRUE(s.Step(0, false).resolve.empty());
  s.Drop(1);
  EXPECT_EQ(s.active(), 1u);
  EXPECT_THAT(s.Step(0, false).resolve, ElementsAre("did:plc:c"));
}

TEST(HostSchedulerTest, HostsOpenMostReadyFirstWithinTheClientsLimits) {
  HostSchedulerOptions o = Wide();
  o.max_hosts = 2;
  o.max_per_host = 2;
  o.max_in_flight = 3;
  HostScheduler s(o);
  // Host a: 3 units, b: 2, c: 1 (each unit its own DID).
  std::map<uint64_t, std::string> host_of;
  uint64_t next = 1;
  for (auto [host, n] : std::vector<std::pair<std::string, int>>{{"c", 1}, {"b", 2}, {"a", 3}}) {
    for (int i = 0; i < n; ++i) {
      const uint64_t u = next++;
      host_of[u] = host;
      s.Add(u, "did:plc:" + std::to_string(u));
    }
  }
  for (const std::string& did : s.Step(0, false).resolve) {
    const uint64_t u = std::stoull(did.substr(8));
    ResolveTo(s, did, host_of[u]);
  }
  SchedulerRequests r = s.Step(0, false);
  // a opens first and fills its 2 slots, then b takes the last of the 3 in flight; c stays closed.
  EXPECT_EQ(PerHost(r.fetch, host_of), (std::map<std::string, int>{{"a", 2}, {"b", 1}}));
  EXPECT_EQ(s.fetching(), 3u);
  EXPECT_EQ(s.open_hosts(), 2u);
  EXPECT_TRUE(s.Step(0, false).fetch.empty());
  // A slot of a frees: a's last ready unit takes it (open hosts are filled before others open).
  s.Drop(r.fetch[0]);
  r = s.Step(0, false);
  EXPECT_EQ(PerHost(r.fetch, host_of), (std::map<std::string, int>{{"a", 1}}));
  // Everything of a and b ends: both close and c opens.
  for (const auto& [u, host] : host_of) {
    if (host != "c") s.Drop(u);
  }
  r = s.Step(0, false);
  EXPECT_EQ(PerHost(r.fetch, host_of), (std::map<std::string, int>{{"c", 1}}));
  EXPECT_EQ(s.open_hosts(), 1u);
}

TEST(HostSchedulerTest, AListingKeepsASlotOfTheRelaysHostAndOfTheTotal) {
  HostSchedulerOptions o = Wide();
  o.max_hosts = 3;
  o.max_per_host = 2;
  o.max_in_flight = 3;
  o.relay_host = "relay";
  for (bool listing : {true, false}) {
    HostScheduler s(o);
    for (uint64_t u = 1; u <= 3; ++u) s.Add(u, "did:plc:r" + std::to_string(u));
    for (uint64_t u = 4; u <= 6; ++u) s.Add(u, "did:plc:p" + std::to_string(u));
    for (const std::string& did : s.Step(0, listing).resolve) {
      ResolveTo(s, did, did.substr(8, 1) == "r" ? "relay" : "pds");
    }
    std::map<uint64_t, std::string> host_of;
    for (uint64_t u = 1; u <= 6; ++u) host_of[u] = u <= 3 ? "relay" : "pds";
    const SchedulerRequests r = s.Step(0, listing);
    if (listing) {
      // 2 in flight in all; the relay's host has 1 slot for its units.
      EXPECT_EQ(r.fetch.size(), 2u);
      EXPECT_LE(PerHost(r.fetch, host_of)["relay"], 1);
    } else {
      EXPECT_EQ(r.fetch.size(), 3u);
      EXPECT_EQ(PerHost(r.fetch, host_of)["relay"], 2);
    }
  }
}

TEST(HostSchedulerTest, ADelayedUnitComesBackOnTimeResolvedOrNot) {
  HostScheduler s(Wide());
  s.Add(1, "did:plc:a");
  s.Add(2, "did:plc:b");
  s.Step(0, false);
  ResolveTo(s, "did:plc:a", "pds");
  EXPECT_THAT(s.Step(0, false).fetch, ElementsAre(1u));
  // 1's fetch failed: it keeps its host. 2's resolution failed: it resolves again.
  s.Delay(1, 1000);
  EXPECT_THAT(s.Resolved("did:plc:b"), ElementsAre(2u));
  s.Delay(2, 1500);
  EXPECT_EQ(s.active(), 0u);
  EXPECT_EQ(s.fetching(), 0u);
  SchedulerRequests r = s.Step(999, false);
  EXPECT_TRUE(r.fetch.empty());
  EXPECT_TRUE(r.resolve.empty());
  r = s.Step(1000, false);
  EXPECT_THAT(r.fetch, ElementsAre(1u));
  EXPECT_TRUE(r.resolve.empty());
  r = s.Step(1500, false);
  EXPECT_THAT(r.resolve, ElementsAre("did:plc:b"));
  EXPECT_EQ(s.active(), 2u);
  s.Drop(1);
  s.Drop(2);
  EXPECT_EQ(s.active(), 0u);
  EXPECT_EQ(s.size(), 0u);
}

}  // namespace
}  // namespace atfill::sources
