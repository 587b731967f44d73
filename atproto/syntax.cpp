#include "atproto/syntax.hpp"

#include <algorithm>
#include <array>
#include <cstdio>

#include "atproto/tid.hpp"

namespace atfill::atproto {
namespace {

constexpr bool IsDigit(char c) { return c >= '0' && c <= '9'; }
constexpr bool IsLower(char c) { return c >= 'a' && c <= 'z'; }
constexpr bool IsUpper(char c) { return c >= 'A' && c <= 'Z'; }
constexpr bool IsAlpha(char c) { return IsLower(c) || IsUpper(c); }
constexpr char ToLower(char c) { return IsUpper(c) ? static_cast<char>(c - 'A' + 'a') : c; }

// Character classes as one table lookup each: identifiers are checked byte by byte on every
// event (DIDs, collections, record keys) and in every lexicon-validated string.
enum CharClass : uint8_t {
  kAlnum = 1,
  kDidChar = 2,        // [A-Za-z0-9._:%-]
  kRecordKeyChar = 4,  // [A-Za-z0-9._:~-]
  kHandleChar = 8,     // [A-Za-z0-9-]
  kCidChar = 16,       // [A-Za-z0-9+=]
  kAtUriChar = 32,     // printable ASCII but space, '#' and '?'
};
constexpr std::array<uint8_t, 256> kCharClasses = [] {
  std::array<uint8_t, 256> t{};
  for (int c = 0; c < 256; ++c) {
    const char ch = static_cast<char>(c);
    const bool alnum = IsAlpha(ch) || IsDigit(ch);
    uint8_t v = 0;
    if (alnum) v |= kAlnum | kDidChar | kRecordKeyChar | kHandleChar | kCidChar;
    if (ch == '.' || ch == '_' || ch == ':' || ch == '-') v |= kDidChar | kRecordKeyChar;
    if (ch == '%') v |= kDidChar;
    if (ch == '~') v |= kRecordKeyChar;
    if (ch == '-') v |= kHandleChar;
    if (ch == '+' || ch == '=') v |= kCidChar;
    if (c > 0x20 && c < 0x7f && ch != '#' && ch != '?') v |= kAtUriChar;
    t[static_cast<size_t>(c)] = v;
  }
  return t;
}();
constexpr bool Is(char c, CharClass k) {
  return (kCharClasses[static_cast<unsigned char>(c)] & k) != 0;
}
constexpr bool IsAlnum(char c) { return Is(c, kAlnum); }
constexpr bool IsDidChar(char c) { return Is(c, kDidChar); }
constexpr bool IsRecordKeyChar(char c) { return Is(c, kRecordKeyChar); }

std::string Num(size_t n) { return std::to_string(n); }

// "did has disallowed character '/' at offset 14"
Status BadChar(std::string_view what, char c, size_t offset) {
  std::string msg(what);
  msg += " has disallowed character ";
  msg += DescribeByte(c);
  msg += " at offset ";
  msg += Num(offset);
  return Status::Invalid(std::move(msg));
}

Status TooLong(std::string_view what, size_t limit) {
  return Status::Invalid(std::string(what) + " is longer than " + Num(limit) + " characters");
}

bool EqualsIgnoreCase(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (ToLower(a[i]) != ToLower(b[i])) return false;
  }
  return true;
}

// The checks below take `base`, the offset of `s` inside the text the caller was given, so an
// error inside an AT URI's authority names the offset in the whole URI.

Status CheckDid(std::string_view s, size_t base) {
  if (s.empty()) return Status::Invalid("did is empty");
  if (s.size() > kMaxDidLength) return TooLong("did", kMaxDidLength);
  if (!s.starts_with("did:")) {
    if (s.size() >= 4 && EqualsIgnoreCase(s.substr(0, 4), "did:")) {
      return Status::Invalid("did must start with lower-case \"did:\"");
    }
    return Status::Invalid("did does not start with \"did:\"");
  }
  size_t i = 4;
  for (; i < s.size() && s[i] != ':'; ++i) {
    if (!IsLower(s[i])) {
      return Status::Invalid("did method has character " + DescribeByte(s[i]) + " at offset " +
                             Num(base + i) + "; a method is lower-case letters only");
    }
  }
  if (i == 4) return Status::Invalid("did method is empty");
  if (i == s.size()) return Status::Invalid("did has no ':' after the method");
  ++i;
  if (i == s.size()) return Status::Invalid("did identifier after the method is empty");
  for (; i < s.size(); ++i) {
    if (!IsDidChar(s[i])) return BadChar("did", s[i], base + i);
  }
  if (s.back() == ':') return Status::Invalid("did ends with ':'");
  if (s.back() == '%') return Status::Invalid("did ends with '%'");
  return Status::OK();
}

Status CheckHandle(std::string_view s, size_t base) {
  if (s.empty()) return Status::Invalid("handle is empty");
  if (s.size() > kMaxHandleLength) return TooLong("handle", kMaxHandleLength);
  if (s.front() == '.') return Status::Invalid("handle starts with '.'");
  if (s.back() == '.') return Status::Invalid("handle ends with '.'");
  size_t segment = 1;
  size_t start = 0;
  for (size_t i = 0; i <= s.size(); ++i) {
    if (i < s.size() && s[i] != '.') {
      if (!Is(s[i], kHandleChar)) return BadChar("handle", s[i], base + i);
      continue;
    }
    const size_t len = i - start;
    if (len == 0) return Status::Invalid("handle segment " + Num(segment) + " is empty");
    if (len > kMaxNsidSegmentLength) {
      return Status::Invalid("handle segment " + Num(segment) + " is longer than 63 characters");
    }
    if (s[start] == '-') {
      return Status::Invalid("handle segment " + Num(segment) + " starts with a hyphen");
    }
    if (s[i - 1] == '-') {
      return Status::Invalid("handle segment " + Num(segment) + " ends with a hyphen");
    }
    ++segment;
    start = i + 1;
  }
  if (segment - 1 < 2) return Status::Invalid("handle has one segment; it needs at least two");
  const size_t tld = s.rfind('.') + 1;
  if (IsDigit(s[tld])) return Status::Invalid("handle top-level domain starts with a digit");
  return Status::OK();
}

Status CheckNsid(std::string_view s, size_t base) {
  if (s.empty()) return Status::Invalid("nsid is empty");
  if (s.size() > kMaxNsidLength) return TooLong("nsid", kMaxNsidLength);
  size_t segments = 1;
  for (char c : s) segments += (c == '.');
  if (segments < 3) {
    return Status::Invalid("nsid has " + Num(segments) +
                           (segments == 1 ? " segment" : " segments") + "; it needs at least 3");
  }
  const size_t name_start = s.rfind('.') + 1;
  size_t segment = 1;
  size_t start = 0;
  for (size_t i = 0; i < name_start; ++i) {
    if (s[i] != '.') {
      if (!Is(s[i], kHandleChar)) return BadChar("nsid", s[i], base + i);
      continue;
    }
    const size_t len = i - start;
    if (len == 0) return Status::Invalid("nsid segment " + Num(segment) + " is empty");
    if (len > kMaxNsidSegmentLength) {
      return Status::Invalid("nsid segment " + Num(segment) + " is longer than 63 characters");
    }
    if (s[start] == '-') {
      return Status::Invalid("nsid segment " + Num(segment) + " starts with a hyphen");
    }
    if (s[i - 1] == '-') {
      return Status::Invalid("nsid segment " + Num(segment) + " ends with a hyphen");
    }
    if (segment == 1 && IsDigit(s[start])) {
      return Status::Invalid("nsid segment 1 starts with a digit");
    }
    ++segment;
    start = i + 1;
  }
  const std::string_view name = s.substr(name_start);
  if (name.empty()) return Status::Invalid("nsid name (the last segment) is empty");
  if (name.size() > kMaxNsidSegmentLength) {
    return Status::Invalid("nsid name (the last segment) is longer than 63 characters");
  }
  for (size_t i = 0; i < name.size(); ++i) {
    if (!IsAlnum(name[i])) return BadChar("nsid name", name[i], base + name_start + i);
  }
  if (IsDigit(name[0])) {
    return Status::Invalid("nsid name (segment " + Num(segments) + ") starts with a digit");
  }
  return Status::OK();
}

Status CheckRecordKey(std::string_view s, size_t base) {
  if (s.empty()) return Status::Invalid("record key is empty");
  if (s.size() > kMaxRecordKeyLength) return TooLong("record key", kMaxRecordKeyLength);
  if (s == "." || s == "..") return Status::Invalid("record key cannot be \".\" or \"..\"");
  for (size_t i = 0; i < s.size(); ++i) {
    if (!IsRecordKeyChar(s[i])) return BadChar("record key", s[i], base + i);
  }
  return Status::OK();
}

Status CheckAtIdentifier(std::string_view s, size_t base) {
  return s.starts_with("did:") ? CheckDid(s, base) : CheckHandle(s, base);
}

// Splits as it validates so Parse can keep the offsets; see AtUri for their meaning.
// The characters of an AT URI: printable ASCII, no query, no fragment. The segment checks below
// refuse every other character too, so this runs only to name the fault when one of them failed.
Status CheckAtUriChars(std::string_view s) {
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (Is(c, kAtUriChar)) continue;
    if (c == '#') {
      return Status::Invalid("at-uri has a fragment ('#' at offset " + Num(i) +
                             "); fragments are not allowed");
    }
    if (c == '?') {
      return Status::Invalid("at-uri has a query ('?' at offset " + Num(i) +
                             "); queries are not allowed");
    }
    return BadChar("at-uri", c, i);
  }
  return Status::OK();
}

Status CheckAtUriSegments(std::string_view s, size_t* authority_end, size_t* collection_end) {
  constexpr std::string_view kPrefix = "at://";
  const size_t auth_start = kPrefix.size();
  size_t auth_end = s.find('/', auth_start);
  if (auth_end == std::string_view::npos) auth_end = s.size();
  *authority_end = auth_end;
  *collection_end = s.size();
  if (auth_end == auth_start) return Status::Invalid("at-uri authority is empty");
  if (Status st = CheckAtIdentifier(s.substr(auth_start, auth_end - auth_start), auth_start);
      !st.ok()) {
    return st.WithContext("at-uri authority");
  }
  if (s.back() == '/') return Status::Invalid("at-uri ends with '/'");
  if (auth_end == s.size()) return Status::OK();

  const size_t coll_start = auth_end + 1;
  size_t coll_end = s.find('/', coll_start);
  if (coll_end == std::string_view::npos) coll_end = s.size();
  *collection_end = coll_end;
  if (coll_end == coll_start) return Status::Invalid("at-uri collection is empty (\"//\")");
  if (Status st = CheckNsid(s.substr(coll_start, coll_end - coll_start), coll_start); !st.ok()) {
    return st.WithContext("at-uri collection");
  }
  if (coll_end == s.size()) return Status::OK();

  const size_t rkey_start = coll_end + 1;
  if (s.find('/', rkey_start) != std::string_view::npos) {
    return Status::Invalid("at-uri path has more than two segments (collection and record key)");
  }
  if (Status st = CheckRecordKey(s.substr(rkey_start), rkey_start); !st.ok()) {
    return st.WithContext("at-uri record key");
  }
  return Status::OK();
}

Status CheckAtUri(std::string_view s, size_t* authority_end, size_t* collection_end) {
  constexpr std::string_view kPrefix = "at://";
  if (s.empty()) return Status::Invalid("at-uri is empty");
  if (s.size() > kMaxAtUriLength) return TooLong("at-uri", kMaxAtUriLength);
  if (!s.starts_with(kPrefix)) return Status::Invalid("at-uri does not start with \"at://\"");
  Status st = CheckAtUriSegments(s, authority_end, collection_end);
  if (st.ok()) return st;
  // A character no AT URI has is the fault to name first, wherever it stands.
  ATFILL_RETURN_IF_ERROR(CheckAtUriChars(s));
  return st;
}

// --- Datetime ---

struct DatetimeFields {
  int year = 0;
  int month = 0;
  int day = 0;
  int hour = 0;
  int minute = 0;
  int second = 0;
  int64_t fraction_us = 0;  // the first six fraction digits
  int offset_sign = 0;      // 0 for 'Z', else +1 or -1
  int offset_hour = 0;
  int offset_minute = 0;
};

std::string Found(std::string_view s, size_t pos) {
  return pos < s.size() ? "found " + DescribeByte(s[pos]) : "found the end of the text";
}

Status ReadDigits(std::string_view s, size_t pos, int count, const char* field, int* out) {
  int value = 0;
  for (int k = 0; k < count; ++k) {
    const size_t at = pos + static_cast<size_t>(k);
    if (at >= s.size() || !IsDigit(s[at])) {
      return Status::Invalid("datetime expects " + Num(static_cast<size_t>(count)) +
                             " digits for the " + field + " at offset " + Num(pos) + ", " +
                             Found(s, at) + " at offset " + Num(at));
    }
    value = value * 10 + (s[at] - '0');
  }
  *out = value;
  return Status::OK();
}

Status ExpectChar(std::string_view s, size_t pos, char want) {
  if (pos < s.size() && s[pos] == want) return Status::OK();
  return Status::Invalid("datetime expects " + DescribeByte(want) + " at offset " + Num(pos) +
                         ", " + Found(s, pos));
}

Status ParseDatetimeShape(std::string_view s, DatetimeFields* f) {
  if (s.empty()) return Status::Invalid("datetime is empty");
  if (s.size() > kMaxDatetimeLength) return TooLong("datetime", kMaxDatetimeLength);
  ATFILL_RETURN_IF_ERROR(ReadDigits(s, 0, 4, "year", &f->year));
  ATFILL_RETURN_IF_ERROR(ExpectChar(s, 4, '-'));
  ATFILL_RETURN_IF_ERROR(ReadDigits(s, 5, 2, "month", &f->month));
  ATFILL_RETURN_IF_ERROR(ExpectChar(s, 7, '-'));
  ATFILL_RETURN_IF_ERROR(ReadDigits(s, 8, 2, "day", &f->day));
  ATFILL_RETURN_IF_ERROR(ExpectChar(s, 10, 'T'));
  ATFILL_RETURN_IF_ERROR(ReadDigits(s, 11, 2, "hour", &f->hour));
  ATFILL_RETURN_IF_ERROR(ExpectChar(s, 13, ':'));
  ATFILL_RETURN_IF_ERROR(ReadDigits(s, 14, 2, "minute", &f->minute));
  ATFILL_RETURN_IF_ERROR(ExpectChar(s, 16, ':'));
  ATFILL_RETURN_IF_ERROR(ReadDigits(s, 17, 2, "second", &f->second));
  size_t pos = 19;
  if (pos < s.size() && s[pos] == '.') {
    const size_t first = ++pos;
    int64_t scale = 100000;
    for (; pos < s.size() && IsDigit(s[pos]); ++pos) {
      f->fraction_us += (s[pos] - '0') * scale;
      scale /= 10;
    }
    if (pos == first) {
      return Status::Invalid("datetime has a '.' with no fraction digits after it (offset " +
                             Num(first - 1) + ")");
    }
  }
  if (pos == s.size()) {
    return Status::Invalid("datetime has no timezone; it needs 'Z' or an offset like +00:00");
  }
  if (s[pos] == 'Z') {
    ++pos;
  } else if (s[pos] == '+' || s[pos] == '-') {
    f->offset_sign = s[pos] == '+' ? 1 : -1;
    ATFILL_RETURN_IF_ERROR(ReadDigits(s, pos + 1, 2, "timezone hour", &f->offset_hour));
    ATFILL_RETURN_IF_ERROR(ExpectChar(s, pos + 3, ':'));
    ATFILL_RETURN_IF_ERROR(ReadDigits(s, pos + 4, 2, "timezone minute", &f->offset_minute));
    if (f->offset_sign < 0 && f->offset_hour == 0 && f->offset_minute == 0) {
      return Status::Invalid("datetime uses \"-00:00\"; write UTC as 'Z' or \"+00:00\"");
    }
    pos += 6;
  } else {
    return Status::Invalid("datetime expects 'Z' or a +HH:MM/-HH:MM timezone at offset " +
                           Num(pos) + ", " + Found(s, pos));
  }
  if (pos != s.size()) {
    return Status::Invalid("datetime has unexpected characters after the timezone at offset " +
                           Num(pos));
  }
  return Status::OK();
}

constexpr bool IsLeapYear(int64_t y) { return y % 4 == 0 && (y % 100 != 0 || y % 400 == 0); }

int DaysInMonth(int year, int month) {
  static constexpr std::array<int, 12> kDays = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
  return month == 2 && IsLeapYear(year) ? 29 : kDays[static_cast<size_t>(month - 1)];
}

// Days from 1970-01-01 to y-m-d in the proleptic Gregorian calendar, counted in 400-year eras
// (146097 days each) so the arithmetic stays exact for any year.
int64_t DaysFromCivil(int64_t y, int m, int d) {
  y -= m <= 2 ? 1 : 0;
  const int64_t era = (y >= 0 ? y : y - 399) / 400;
  const int64_t yoe = y - era * 400;
  const int64_t mp = (m + 9) % 12;  // March is 0, so the leap day ends the year
  const int64_t doy = (153 * mp + 2) / 5 + d - 1;
  const int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
  return era * 146097 + doe - 719468;
}

struct Civil {
  int64_t year;
  int month;
  int day;
};

Civil CivilFromDays(int64_t z) {
  z += 719468;
  const int64_t era = (z >= 0 ? z : z - 146096) / 146097;
  const int64_t doe = z - era * 146097;
  const int64_t yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
  const int64_t doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
  const int64_t mp = (5 * doy + 2) / 153;
  const int day = static_cast<int>(doy - (153 * mp + 2) / 5 + 1);
  const int month = static_cast<int>(mp < 10 ? mp + 3 : mp - 9);
  return {yoe + era * 400 + (month <= 2 ? 1 : 0), month, day};
}

constexpr int64_t kMicrosPerSecond = 1'000'000;
constexpr int64_t kSecondsPerDay = 86'400;

std::string TwoDigits(int v) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "%02d", v);
  return buf;
}

Status CheckDatetime(std::string_view s, int64_t* micros) {
  DatetimeFields f;
  ATFILL_RETURN_IF_ERROR(ParseDatetimeShape(s, &f));
  if (f.month < 1 || f.month > 12) {
    return Status::Invalid("datetime month " + TwoDigits(f.month) + " is out of range (01-12)");
  }
  if (f.day < 1 || f.day > DaysInMonth(f.year, f.month)) {
    return Status::Invalid("datetime day " + TwoDigits(f.day) + " does not exist in " +
                           std::string(s.substr(0, 7)));
  }
  if (f.hour > 23) {
    return Status::Invalid("datetime hour " + TwoDigits(f.hour) + " is out of range (00-23)");
  }
  if (f.minute > 59) {
    return Status::Invalid("datetime minute " + TwoDigits(f.minute) + " is out of range (00-59)");
  }
  if (f.second > 59) {
    return Status::Invalid("datetime second " + TwoDigits(f.second) + " is out of range (00-59)");
  }
  if (f.offset_hour > 23 || f.offset_minute > 59) {
    return Status::Invalid("datetime timezone offset " + std::string(s.substr(s.size() - 6)) +
                           " is out of range");
  }
  const int64_t seconds = DaysFromCivil(f.year, f.month, f.day) * kSecondsPerDay + f.hour * 3600 +
                          f.minute * 60 + f.second -
                          f.offset_sign * (f.offset_hour * 3600 + f.offset_minute * 60);
  if (seconds < DaysFromCivil(0, 1, 1) * kSecondsPerDay) {
    return Status::Invalid("datetime is before 0000-01-01T00:00:00Z once converted to UTC");
  }
  *micros = seconds * kMicrosPerSecond + f.fraction_us;
  return Status::OK();
}

// --- Language ---

// Calls fn(subtag, offset) for each '-'-separated subtag after the primary one; stops early when
// fn returns a non-OK status.
template <typename Fn>
Status ForEachSubtag(std::string_view s, size_t from, Fn&& fn) {
  while (from < s.size()) {
    size_t end = s.find('-', from);
    if (end == std::string_view::npos) end = s.size();
    ATFILL_RETURN_IF_ERROR(fn(s.substr(from, end - from), from));
    from = end + 1;
  }
  return Status::OK();
}

Status CheckLanguageShape(std::string_view s) {
  if (s.empty()) return Status::Invalid("language tag is empty");
  const size_t primary_end = std::min(s.find('-'), s.size());
  const std::string_view primary = s.substr(0, primary_end);
  const bool singleton = primary == "i" || primary == "x" || primary == "X";
  bool lower_letters = primary.size() >= 2 && primary.size() <= 3;
  for (char c : primary) lower_letters = lower_letters && IsLower(c);
  if (!singleton && !lower_letters) {
    return Status::Invalid(
        "language tag must start with 2 or 3 lower-case letters (or \"i-\" or \"x-\")");
  }
  if (singleton && primary_end == s.size()) {
    return Status::Invalid("language tag \"" + std::string(primary) + "\" needs a subtag after it");
  }
  if (primary_end + 1 == s.size()) return Status::Invalid("language tag ends with '-'");
  return ForEachSubtag(s, primary_end + 1, [&](std::string_view tag, size_t at) -> Status {
    if (tag.empty())
      return Status::Invalid("language tag has an empty subtag at offset " + Num(at));
    if (tag.size() > 8) {
      return Status::Invalid("language subtag at offset " + Num(at) +
                             " is longer than 8 characters");
    }
    for (size_t i = 0; i < tag.size(); ++i) {
      if (!IsAlnum(tag[i])) return BadChar("language tag", tag[i], at + i);
    }
    return Status::OK();
  });
}

// RFC 5646 section 2.2.9: a tag is valid only if no variant subtag and no extension singleton
// appears twice (case-insensitively). Variants are the 5-8 character subtags (or 4 starting with a
// digit) before the first singleton; everything after 'x' is private use and unconstrained.
Status CheckLanguageRepeats(std::string_view s) {
  const size_t primary_end = std::min(s.find('-'), s.size());
  if (s.substr(0, primary_end) == "x" || s.substr(0, primary_end) == "X") return Status::OK();
  std::array<bool, 36> seen_singleton{};
  bool in_extension = false;
  bool private_use = false;
  return ForEachSubtag(s, primary_end + 1, [&](std::string_view tag, size_t at) -> Status {
    if (private_use) return Status::OK();
    if (tag.size() == 1) {
      const char c = ToLower(tag[0]);
      if (c == 'x') {
        private_use = true;
        return Status::OK();
      }
      const size_t slot = IsDigit(c) ? static_cast<size_t>(c - '0') : 10 + (c - 'a');
      if (seen_singleton[slot]) {
        return Status::Invalid("language tag repeats the extension singleton '" +
                               std::string(1, c) + "' (offset " + Num(at) + ")");
      }
      seen_singleton[slot] = true;
      in_extension = true;
      return Status::OK();
    }
    if (in_extension) return Status::OK();
    const bool variant = tag.size() >= 5 || (tag.size() == 4 && IsDigit(tag[0]));
    if (!variant) return Status::OK();
    // Tags are short; rescanning the earlier subtags avoids any allocation.
    return ForEachSubtag(
        s.substr(0, at), primary_end + 1, [&](std::string_view earlier, size_t) -> Status {
          if (EqualsIgnoreCase(earlier, tag)) {
            return Status::Invalid("language tag repeats the variant subtag \"" + std::string(tag) +
                                   "\" (offset " + Num(at) + ")");
          }
          return Status::OK();
        });
  });
}

}  // namespace

std::string DescribeByte(char c) {
  const auto u = static_cast<unsigned char>(c);
  if (u == ' ') return "a space";
  if (u > 0x20 && u < 0x7f) return std::string{'\'', c, '\''};
  char buf[16];
  std::snprintf(buf, sizeof(buf), "byte 0x%02X", u);
  return buf;
}

Status ValidateDid(std::string_view text) { return CheckDid(text, 0); }
Status ValidateHandle(std::string_view text) { return CheckHandle(text, 0); }
Status ValidateNsid(std::string_view text) { return CheckNsid(text, 0); }
Status ValidateRecordKey(std::string_view text) { return CheckRecordKey(text, 0); }
Status ValidateAtIdentifier(std::string_view text) { return CheckAtIdentifier(text, 0); }

Status ValidateAtUri(std::string_view text) {
  size_t authority_end = 0;
  size_t collection_end = 0;
  return CheckAtUri(text, &authority_end, &collection_end);
}

Status ValidateDatetime(std::string_view text) {
  int64_t micros = 0;
  return CheckDatetime(text, &micros);
}

Status ValidateDatetimeSyntax(std::string_view text) {
  DatetimeFields fields;
  return ParseDatetimeShape(text, &fields);
}

Status ValidateCid(std::string_view text) {
  if (text.empty()) return Status::Invalid("cid is empty");
  if (text.size() < kMinCidStringLength) {
    return Status::Invalid("cid is shorter than 8 characters");
  }
  if (text.size() > kMaxCidStringLength) return TooLong("cid", kMaxCidStringLength);
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (!Is(c, kCidChar)) return BadChar("cid", c, i);
  }
  // A CIDv0 is a bare base58btc sha2-256 multihash: 46 characters starting "Qm".
  if (text.size() == 46 && text.starts_with("Qm")) {
    return Status::Invalid("cid is a CIDv0 (\"Qm...\"), which atproto does not allow");
  }
  return Status::OK();
}

Status ValidateLanguage(std::string_view text) {
  ATFILL_RETURN_IF_ERROR(CheckLanguageShape(text));
  return CheckLanguageRepeats(text);
}

Status ValidateLanguageSyntax(std::string_view text) { return CheckLanguageShape(text); }

Status ValidateUri(std::string_view text) {
  if (text.empty()) return Status::Invalid("uri is empty");
  if (text.size() > kMaxUriLength) return TooLong("uri", kMaxUriLength);
  const size_t colon = text.find(':');
  if (colon == std::string_view::npos) return Status::Invalid("uri has no scheme (no ':')");
  if (!IsAlpha(text[0])) return Status::Invalid("uri scheme must start with a letter");
  for (size_t i = 1; i < colon; ++i) {
    const char c = text[i];
    if (!IsAlnum(c) && c != '+' && c != '-' && c != '.') return BadChar("uri scheme", c, i);
  }
  if (colon + 1 == text.size()) return Status::Invalid("uri has nothing after the scheme");
  for (size_t i = colon + 1; i < text.size(); ++i) {
    const auto u = static_cast<unsigned char>(text[i]);
    if (u <= 0x20 || u >= 0x7f) return BadChar("uri", text[i], i);
  }
  return Status::OK();
}

// --- Dispatch ---

namespace {

struct KindName {
  std::string_view name;
  SyntaxKind kind;
};

// The first entry for a kind is its SyntaxKindName.
constexpr KindName kKindNames[] = {
    {"did", SyntaxKind::kDid},
    {"handle", SyntaxKind::kHandle},
    {"nsid", SyntaxKind::kNsid},
    {"rkey", SyntaxKind::kRecordKey},
    {"tid", SyntaxKind::kTid},
    {"aturi", SyntaxKind::kAtUri},
    {"datetime", SyntaxKind::kDatetime},
    {"cid", SyntaxKind::kCid},
    {"atidentifier", SyntaxKind::kAtIdentifier},
    {"language", SyntaxKind::kLanguage},
    {"uri", SyntaxKind::kUri},
    {"record-key", SyntaxKind::kRecordKey},
    {"recordkey", SyntaxKind::kRecordKey},
    {"at-uri", SyntaxKind::kAtUri},
    {"at-identifier", SyntaxKind::kAtIdentifier},
};

}  // namespace

Result<SyntaxKind> ParseSyntaxKind(std::string_view name) {
  for (const KindName& entry : kKindNames) {
    if (entry.name == name) return entry.kind;
  }
  return Status::Invalid("unknown syntax kind \"" + std::string(name) +
                         "\"; expected one of did, handle, nsid, rkey, tid, aturi, datetime, cid, "
                         "atidentifier, language, uri");
}

std::string_view SyntaxKindName(SyntaxKind kind) {
  for (const KindName& entry : kKindNames) {
    if (entry.kind == kind) return entry.name;
  }
  return "unknown";
}

Status ValidateSyntax(SyntaxKind kind, std::string_view text) {
  switch (kind) {
    case SyntaxKind::kDid:
      return ValidateDid(text);
    case SyntaxKind::kHandle:
      return ValidateHandle(text);
    case SyntaxKind::kNsid:
      return ValidateNsid(text);
    case SyntaxKind::kRecordKey:
      return ValidateRecordKey(text);
    case SyntaxKind::kTid:
      return ValidateTid(text);
    case SyntaxKind::kAtUri:
      return ValidateAtUri(text);
    case SyntaxKind::kDatetime:
      return ValidateDatetime(text);
    case SyntaxKind::kCid:
      return ValidateCid(text);
    case SyntaxKind::kAtIdentifier:
      return ValidateAtIdentifier(text);
    case SyntaxKind::kLanguage:
      return ValidateLanguage(text);
    case SyntaxKind::kUri:
      return ValidateUri(text);
  }
  return Status::Internal("unhandled syntax kind");
}

// --- Value types ---

Result<Did> Did::Parse(std::string_view text) {
  ATFILL_RETURN_IF_ERROR(ValidateDid(text));
  return Did(std::string(text));
}

std::string_view Did::method() const {
  if (str_.size() < 4) return {};
  const std::string_view s(str_);
  return s.substr(4, s.find(':', 4) - 4);
}

std::string_view Did::identifier() const {
  const std::string_view s(str_);
  const size_t colon = s.size() < 4 ? std::string_view::npos : s.find(':', 4);
  return colon == std::string_view::npos ? std::string_view() : s.substr(colon + 1);
}

Result<std::string> Did::WebHost() const {
  if (!is_web()) return Status::Invalid("did is not a did:web");
  const std::string_view id = identifier();
  if (id.find(':') != std::string_view::npos) {
    return Status::Unsupported("path-based did:web is not supported by atproto");
  }
  std::string host;
  host.reserve(id.size());
  for (size_t i = 0; i < id.size(); ++i) {
    if (id[i] != '%') {
      host += id[i];
      continue;
    }
    if (i + 2 < id.size() && id[i + 1] == '3' && ToLower(id[i + 2]) == 'a') {
      host += ':';
      i += 2;
      continue;
    }
    return Status::Invalid("did:web host has a percent-escape other than %3A (a port separator)");
  }
  return host;
}

Result<Handle> Handle::Parse(std::string_view text) {
  ATFILL_RETURN_IF_ERROR(ValidateHandle(text));
  return Handle(std::string(text));
}

std::string Handle::Normalized() const {
  std::string out = str_;
  for (char& c : out) c = ToLower(c);
  return out;
}

Result<Nsid> Nsid::Parse(std::string_view text) {
  ATFILL_RETURN_IF_ERROR(ValidateNsid(text));
  return Nsid(std::string(text));
}

std::string_view Nsid::authority() const {
  const size_t dot = str_.rfind('.');
  return dot == std::string::npos ? std::string_view() : std::string_view(str_).substr(0, dot);
}

std::string_view Nsid::name() const {
  const size_t dot = str_.rfind('.');
  return dot == std::string::npos ? std::string_view(str_) : std::string_view(str_).substr(dot + 1);
}

std::string Nsid::DomainAuthority() const {
  const std::string_view auth = authority();
  std::string out;
  out.reserve(auth.size());
  size_t end = auth.size();
  while (end > 0) {
    const size_t dot = auth.rfind('.', end - 1);
    const size_t start = dot == std::string_view::npos ? 0 : dot + 1;
    if (!out.empty()) out += '.';
    for (char c : auth.substr(start, end - start)) out += ToLower(c);
    end = dot == std::string_view::npos ? 0 : dot;
  }
  return out;
}

Result<RecordKey> RecordKey::Parse(std::string_view text) {
  ATFILL_RETURN_IF_ERROR(ValidateRecordKey(text));
  return RecordKey(std::string(text));
}

Result<CidString> CidString::Parse(std::string_view text) {
  ATFILL_RETURN_IF_ERROR(ValidateCid(text));
  return CidString(std::string(text));
}

Result<Language> Language::Parse(std::string_view text) {
  ATFILL_RETURN_IF_ERROR(ValidateLanguage(text));
  return Language(std::string(text));
}

std::string_view Language::primary() const {
  return std::string_view(str_).substr(0, str_.find('-'));
}

Result<AtIdentifier> AtIdentifier::Parse(std::string_view text) {
  if (text.starts_with("did:")) {
    ATFILL_ASSIGN_OR_RETURN(Did did, Did::Parse(text));
    return AtIdentifier(std::move(did));
  }
  ATFILL_ASSIGN_OR_RETURN(Handle handle, Handle::Parse(text));
  return AtIdentifier(std::move(handle));
}

const std::string& AtIdentifier::str() const {
  return std::visit([](const auto& v) -> const std::string& { return v.str(); }, value_);
}

Result<AtUri> AtUri::Parse(std::string_view text) {
  size_t authority_end = 0;
  size_t collection_end = 0;
  ATFILL_RETURN_IF_ERROR(CheckAtUri(text, &authority_end, &collection_end));
  return AtUri(std::string(text), static_cast<uint32_t>(authority_end),
               static_cast<uint32_t>(collection_end));
}

std::string AtUri::Format(std::string_view did, std::string_view collection,
                          std::string_view rkey) {
  std::string out;
  out.reserve(5 + did.size() + 1 + collection.size() + 1 + rkey.size());
  out += "at://";
  out += did;
  out += '/';
  out += collection;
  out += '/';
  out += rkey;
  return out;
}

std::string AtUri::Format(const Did& did, const Nsid& collection, const RecordKey& rkey) {
  return Format(std::string_view(did.str()), std::string_view(collection.str()),
                std::string_view(rkey.str()));
}

AtUri AtUri::ForRecord(const Did& did, const Nsid& collection, const RecordKey& rkey) {
  const size_t authority_end = 5 + did.str().size();
  const size_t collection_end = authority_end + 1 + collection.str().size();
  return AtUri(Format(did, collection, rkey), static_cast<uint32_t>(authority_end),
               static_cast<uint32_t>(collection_end));
}

std::string_view AtUri::authority() const {
  if (str_.size() < 5) return {};
  return std::string_view(str_).substr(5, authority_end_ - 5);
}

std::string_view AtUri::collection() const {
  if (!has_collection()) return {};
  return std::string_view(str_).substr(authority_end_ + 1, collection_end_ - authority_end_ - 1);
}

std::string_view AtUri::rkey() const {
  if (!has_rkey()) return {};
  return std::string_view(str_).substr(collection_end_ + 1);
}

Result<Datetime> Datetime::Parse(std::string_view text) {
  int64_t micros = 0;
  ATFILL_RETURN_IF_ERROR(CheckDatetime(text, &micros));
  return Datetime(std::string(text), micros);
}

Result<Datetime> Datetime::FromUnixMicros(int64_t micros) {
  const int64_t min_micros = DaysFromCivil(0, 1, 1) * kSecondsPerDay * kMicrosPerSecond;
  const int64_t max_micros = DaysFromCivil(10000, 1, 1) * kSecondsPerDay * kMicrosPerSecond - 1;
  if (micros < min_micros || micros > max_micros) {
    return Status::OutOfRange("unix time " + std::to_string(micros) +
                              " us is outside the years 0000-9999");
  }
  int64_t seconds = micros / kMicrosPerSecond;
  int64_t fraction = micros % kMicrosPerSecond;
  if (fraction < 0) {
    fraction += kMicrosPerSecond;
    seconds -= 1;
  }
  int64_t days = seconds / kSecondsPerDay;
  int64_t second_of_day = seconds % kSecondsPerDay;
  if (second_of_day < 0) {
    second_of_day += kSecondsPerDay;
    days -= 1;
  }
  const Civil date = CivilFromDays(days);
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%04d-%02d-%02dT%02d:%02d:%02d.%06dZ",
                static_cast<int>(date.year), date.month, date.day,
                static_cast<int>(second_of_day / 3600), static_cast<int>(second_of_day / 60 % 60),
                static_cast<int>(second_of_day % 60), static_cast<int>(fraction));
  return Datetime(buf, micros);
}

}  // namespace atfill::atproto
