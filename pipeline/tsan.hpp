// Happens-before annotations for ThreadSanitizer, no-ops in other builds. Debian's libtbb is not
// built with TSan, so the ordering its scheduler provides between node bodies is invisible to
// TSan; the engine states it at each hand-off instead (see engine_graph.cpp).
#pragma once

// ATFILL_TSAN may also be defined by the build, for a file of a TSan build compiled without
// instrumentation (engine_graph.cpp): its annotations still reach the TSan runtime.
#if !defined(ATFILL_TSAN)
#if defined(__SANITIZE_THREAD__)
#define ATFILL_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define ATFILL_TSAN 1
#endif
#endif
#endif

#if defined(ATFILL_TSAN)
#include <sanitizer/tsan_interface.h>
#endif

namespace atfill::pipeline {

// Everything this thread did so far happens before a later HappensAfter(token) elsewhere.
inline void HappensBefore(const void* token) {
#if defined(ATFILL_TSAN)
  __tsan_release(const_cast<void*>(token));
#else
  (void)token;
#endif
}

inline void HappensAfter(const void* token) {
#if defined(ATFILL_TSAN)
  __tsan_acquire(const_cast<void*>(token));
#else
  (void)token;
#endif
}

}  // namespace atfill::pipeline
