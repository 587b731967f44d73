// Helpers the libFuzzer targets share: invariant checks that stop the run with a message, a JSON
// validity oracle independent of the decoder under test, and the shared-data and work folders the
// ctest passes (run_fuzz.sh exports ATFILL_FUZZ_DATA = ../shared/protocols/jetstream/data and
// ATFILL_FUZZ_WORK).
#pragma once

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>

namespace atfill::fuzz {

// Aborts (a finding for libFuzzer) with `what` when `ok` is false.
inline void Check(bool ok, const char* what) {
  if (ok) return;
  std::fprintf(stderr, "fuzz invariant failed: %s\n", what);
  std::abort();
}

// True when `bytes` is UTF-8 (no overlong forms, surrogates or code points past U+10FFFF).
inline bool IsUtf8(std::string_view bytes) {
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  const size_t n = bytes.size();
  for (size_t i = 0; i < n;) {
    const unsigned c = p[i];
    size_t len = 0;
    unsigned lo = 0x80, hi = 0xBF;  // the range of the second byte
    if (c < 0x80) {
      ++i;
      continue;
    } else if (c >= 0xC2 && c <= 0xDF) {
      len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      if (c == 0xE0) lo = 0xA0;
      if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      if (c == 0xF0) lo = 0x90;
      if (c == 0xF4) hi = 0x8F;
    } else {
      return false;
    }
    if (n - i < len || p[i + 1] < lo || p[i + 1] > hi) return false;
    for (size_t k = 2; k < len; ++k) {
      if (p[i + k] < 0x80 || p[i + k] > 0xBF) return false;
    }
    i += len;
  }
  return true;
}

// True when `text` is exactly one JSON value by the grammar of RFC 8259 (any nesting depth, any
// number size), with whitespace around it. Written apart from simdjson, whose DOM parser is
// stricter than the RFC (it refuses integers of more than 64 bits), so that it judges the
// decoders, which use simdjson, from the outside.
inline bool IsJson(std::string_view s) {
  if (!IsUtf8(s)) return false;
  size_t i = 0;
  std::string open;  // the unclosed '{' and '['
  const auto ws = [&] {
    while (i < s.size() && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r')) ++i;
  };
  const auto digits = [&] {
    const size_t start = i;
    while (i < s.size() && s[i] >= '0' && s[i] <= '9') ++i;
    return i > start;
  };
  const auto hex = [](char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
  };
  const auto string = [&] {
    if (i >= s.size() || s[i] != '"') return false;
    for (++i; i < s.size(); ++i) {
      const auto c = static_cast<unsigned char>(s[i]);
      if (c == '"') {
        ++i;
        return true;
      }
      if (c < 0x20) return false;
      if (c != '\\') continue;
      if (++i >= s.size()) return false;
      if (s[i] == 'u') {
        if (s.size() - i < 5 || !hex(s[i + 1]) || !hex(s[i + 2]) || !hex(s[i + 3]) ||
            !hex(s[i + 4])) {
          return false;
        }
        i += 4;
      } else if (std::string_view("\"\\/bfnrt").find(s[i]) == std::string_view::npos) {
        return false;
      }
    }
    return false;
  };
  const auto scalar = [&] {
    if (i >= s.size()) return false;
    if (s[i] == '"') return string();
    for (std::string_view word : {"true", "false", "null"}) {
      if (s.substr(i, word.size()) == word) {
        i += word.size();
        return true;
      }
    }
    if (s[i] == '-') ++i;
    if (i < s.size() && s[i] == '0') {
      ++i;
    } else if (!digits()) {
      return false;
    }
    if (i < s.size() && s[i] == '.') {
      ++i;
      if (!digits()) return false;
    }
    if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
      ++i;
      if (i < s.size() && (s[i] == '+' || s[i] == '-')) ++i;
      if (!digits()) return false;
    }
    return true;
  };
  // A value starts here: an opening bracket is pushed (and an empty container closed at once),
  // anything else is one scalar. Then, after each value, a ',' or the closing bracket.
  const auto key = [&] {
    ws();
    if (!string()) return false;
    ws();
    if (i >= s.size() || s[i] != ':') return false;
    ++i;
    return true;
  };
  ws();
  for (;;) {
    ws();
    if (i < s.size() && (s[i] == '{' || s[i] == '[')) {
      open.push_back(s[i++]);
      ws();
      if (i < s.size() && s[i] == (open.back() == '{' ? '}' : ']')) {
        ++i;
        open.pop_back();
      } else {
        if (open.back() == '{' && !key()) return false;
        continue;
      }
    } else if (!scalar()) {
      return false;
    }
    for (;;) {
      ws();
      if (open.empty()) return i == s.size();
      if (i >= s.size()) return false;
      if (s[i] == ',') {
        ++i;
        if (open.back() == '{' && !key()) return false;
        break;
      }
      if (s[i] != (open.back() == '{' ? '}' : ']')) return false;
      ++i;
      open.pop_back();
    }
  }
}

// The contents of `relative` under $ATFILL_FUZZ_DATA, or nullopt when the variable is unset or
// the file cannot be read.
inline std::optional<std::string> ReadSharedFile(std::string_view relative) {
  const char* dir = std::getenv("ATFILL_FUZZ_DATA");
  if (dir == nullptr || *dir == '\0') return std::nullopt;
  std::ifstream in(std::string(dir) + "/" + std::string(relative), std::ios::binary);
  if (!in) return std::nullopt;
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Writes `content` as the seed `name` in $ATFILL_FUZZ_WORK, the folder libFuzzer writes its
// corpus to (in the build tree): for seeds a target derives from shared data in
// LLVMFuzzerInitialize, which runs before libFuzzer reads its corpus folders. Does nothing when
// the variable is unset.
inline void WriteSeed(const std::string& name, std::string_view content) {
  const char* work = std::getenv("ATFILL_FUZZ_WORK");
  if (work == nullptr || *work == '\0') return;
  std::ofstream(std::string(work) + "/" + name, std::ios::binary) << content;
}

// Calls fn(line) for each '\n'-separated line of `text` (the last one may lack the newline).
template <typename Fn>
void ForEachLine(std::string_view text, Fn fn) {
  while (!text.empty()) {
    const size_t end = text.find('\n');
    fn(text.substr(0, end));
    if (end == std::string_view::npos) break;
    text.remove_prefix(end + 1);
  }
}

}  // namespace atfill::fuzz
