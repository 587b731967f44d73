// The simulated network whose Jetstream live_bench and launcher_bench catch up from, so both
// measure the same stream: 2,000 accounts on 4 PDSs, `events` events, published all at the start
// (rate 0) or at `rate` events/s.
#pragma once

#include <cstdint>

#include "tools/simnet/simnet.hpp"

namespace atfill::bench {

inline simnet::SimnetOptions JetstreamBacklog(uint64_t events, double rate) {
  simnet::SimnetOptions o;
  o.seed = 5;
  o.accounts = 2'000;
  o.pds_hosts = 4;
  o.max_records = 1;
  o.threads = 1;
  o.jetstream.events = events;
  o.jetstream.events_per_second = rate;
  o.jetstream.prerender = true;  // simnet only sends: the CPU left is the consumer's
  return o;
}

}  // namespace atfill::bench
