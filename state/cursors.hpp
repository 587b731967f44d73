// Named cursors: where each source resumes (relay cursor per collection, Jetstream watermark and
// witnessed time, archive seq, file offsets). Names are free-form; by convention
// "<source>/<detail>" (e.g. "relay/app.bsky.feed.post").
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "base/status.hpp"
#include "state/kv_store.hpp"

namespace atfill::state {

// Stateless over a KvStore it does not own (which must outlive it); thread-safe as the store is.
// Writes go into a caller's WriteBatch so a cursor moves in the same commit as the work it covers.
class Cursors {
 public:
  explicit Cursors(KvStore& kv) : kv_(kv) {}

  // nullopt when the cursor was never set.
  Result<std::optional<std::string>> Get(std::string_view name);
  void Set(WriteBatch* batch, std::string_view name, std::string_view value);
  void Remove(WriteBatch* batch, std::string_view name);

  // Stored as decimal text; a value that is not one is Corrupt naming the cursor.
  Result<std::optional<uint64_t>> GetUint64(std::string_view name);
  void SetUint64(WriteBatch* batch, std::string_view name, uint64_t value);

  // Calls fn(name, value) for cursors whose name starts with `prefix`, in name order.
  Status List(std::string_view prefix,
              const std::function<bool(std::string_view, std::string_view)>& fn);

 private:
  KvStore& kv_;
};

}  // namespace atfill::state
