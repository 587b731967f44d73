#include "pipeline/sink.hpp"

namespace atfill::pipeline {

WriteStats& WriteStats::operator+=(const WriteStats& o) {
  inserted += o.inserted;
  updated += o.updated;
  unchanged += o.unchanged;
  stale += o.stale;
  deleted += o.deleted;
  purged_accounts += o.purged_accounts;
  purged_records += o.purged_records;
  resyncs += o.resyncs;
  resynced_records += o.resynced_records;
  return *this;
}

}  // namespace atfill::pipeline
