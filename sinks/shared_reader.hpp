// Internal to sinks/: a backend's reader shared by callers on any thread, for the functions the
// stages call back into the database with (does it hold records of an account, the record at a
// URI).
#pragma once

#include <memory>
#include <mutex>
#include <utility>

#include "base/status.hpp"

namespace atfill::sinks {

// Opens `Reader::Open(where)` at the first call and keeps it behind a mutex; a database or table
// not created yet (NotFound) answers `empty` and is tried again at the next call. `call(reader,
// args...)` gives the answer.
template <typename Reader, typename Where, typename T, typename Call>
auto SharedReader(Where where, T empty, Call call) {
  struct Shared {
    std::mutex mu;
    Where where;
    std::unique_ptr<Reader> reader;
  };
  auto shared = std::make_shared<Shared>();
  shared->where = std::move(where);
  return [shared, empty, call](auto&&... args) -> Result<T> {
    std::lock_guard<std::mutex> lock(shared->mu);
    if (shared->reader == nullptr) {
      auto opened = Reader::Open(shared->where);
      if (!opened.ok()) {
        if (opened.status().code() == StatusCode::kNotFound) return empty;
        return opened.status();
      }
      shared->reader = std::move(*opened);
    }
    return call(*shared->reader, args...);
  };
}

}  // namespace atfill::sinks
