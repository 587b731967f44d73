// Labels (com.atproto.label.defs#label) as a labeler's subscribeLabels stream delivers them, and
// the interface of the sinks that store them. Labels do not flow through the record graph: they
// have no repo, rev or tombstone, so the label subscription (sources/labels/labeler.hpp) batches
// them into a LabelSink of their own and commits its cursor after each batch.
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
  uint64_t stored = 0;   // labels inserted or replacing an older label or negation
  uint64_t negated = 0;  // negations inserted or replacing an older label or negation
  uint64_t stale = 0;    // labels and negations older (cts) than the stored one: ignored

  // Counts one applied label or negation that changed `rows` rows.
  void Count(const Label& label, uint64_t rows) {
    if (rows == 0) {
      ++stale;
    } else if (label.neg) {
      ++negated;
    } else {
      ++stored;
    }
  }
};

// The write rules every label sink implements, in one transaction per batch, in order: a label
// or a negation is upserted by (src, uri, val), replacing the stored one unless that one is newer
// (its cts is later), in which case it is stale. A negation is kept as a row with its cts, not
// applied as a removal, so a label older than it that arrives after it stays negated: the newest
// by cts wins whatever the order of arrival, and replaying a stream from any earlier cursor
// converges to the same table. Negations and expired labels are left out by the atfill_labels
// view, not when writing.
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
