// Labels (com.atproto.label.defs#label) as a labeler's subscribeLabels stream delivers them, and
// the interface of the sinks that store them. Labels do not flow through the record graph: they
// have no repo, rev or tombstone, so the label subscription (sources/labeler.hpp) batches them
// into a LabelSink of their own and commits its cursor after each batch.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "base/status.hpp"

namespace atfill::pipeline {

// One verified label.
struct Label {
  std::string src;     // the labeler's DID
  std::string uri;     // the subject: an AT URI (a record) or a DID (an account)
  std::string cid;     // the record version the label is pinned to; empty for every version
  std::string val;     // the label value ("spam", "!hide"...)
  bool neg = false;    // a negation: removes the label (src, uri, val)
  std::string cts;     // creation time, as the labeler wrote it
  int64_t cts_us = 0;  // the same in unix microseconds
  std::string exp;     // expiry, as written; empty when the label does not expire
  int64_t exp_us = 0;  // the same in unix microseconds; 0 when none
};

struct LabelWriteStats {
  uint64_t stored = 0;   // labels inserted or replacing an older one of (src, uri, val)
  uint64_t negated = 0;  // stored labels removed by negations
  uint64_t stale = 0;    // labels older (cts) than the stored label: ignored

  // Counts one applied label or negation that changed `rows` rows.
  void Count(const Label& label, uint64_t rows) {
    if (label.neg) {
      negated += rows;
    } else if (rows > 0) {
      ++stored;
    } else {
      ++stale;
    }
  }
};

// The write rules every label sink implements, in one transaction per batch, in order:
//  * a label is upserted by (src, uri, val): it replaces the stored one unless that one is newer
//    (its cts is later), in which case it is stale;
//  * a negation removes the stored (src, uri, val) whose cts is not later than its own.
// Replaying a stream from any earlier cursor, in order, therefore converges to the same table.
// Expiry is not applied when writing: the atfill_labels view leaves out expired labels.
class LabelSink {
 public:
  virtual ~LabelSink() = default;

  // Applies `labels` atomically and returns once they are durable. Called by one thread at a
  // time. A transient failure (database locked or down) is Unavailable with nothing applied.
  virtual Result<LabelWriteStats> WriteLabels(std::span<const Label> labels) = 0;

  // "sqlite:/path" or "postgres:host:port/db", for messages.
  virtual std::string Describe() const = 0;
};

}  // namespace atfill::pipeline
