// The atproto identifier syntax layer: DID, handle, NSID, record key, AT URI, datetime, CID
// string, at-identifier, language tag and generic URI (TIDs live in tid.hpp).
//
// Two entry points per syntax:
// - `Status ValidateXxx(std::string_view)`: checks the text and allocates nothing when it is valid;
//   an invalid input yields Status::Invalid with one short sentence naming what is wrong and, where
//   it helps, the byte offset ("nsid segment 1 starts with a digit", "did has disallowed character
//   '/' at offset 14"). These sit on hot paths (every event's DID, collection and rkey).
// - A value type (`Did`, `Handle`, ...) whose `static Result<T> Parse(std::string_view)` runs the
//   same check and keeps a copy of the text. A default-constructed value is an empty placeholder
//   (empty() is true) and is not a valid identifier.
//
// The rules follow the atproto specs (atproto.com/specs/{did,handle,nsid,record-key,at-uri-scheme,
// lexicon#datetime}); where the specs and the interop test vectors disagree the vectors win (for
// example an NSID's authority may exceed 253 characters as long as the whole NSID fits in 317).
//
// Everything here is thread-compatible: values are immutable after Parse, free functions are pure.
#pragma once

#include <compare>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

#include "base/status.hpp"

namespace atfill::atproto {

inline constexpr size_t kMaxDidLength = 2048;
inline constexpr size_t kMaxHandleLength = 253;
inline constexpr size_t kMaxNsidLength = 317;
inline constexpr size_t kMaxNsidSegmentLength = 63;  // also a handle's segment limit
inline constexpr size_t kMaxRecordKeyLength = 512;
inline constexpr size_t kMaxAtUriLength = 8192;
inline constexpr size_t kMaxUriLength = 8192;
inline constexpr size_t kMaxDatetimeLength = 64;
inline constexpr size_t kMinCidStringLength = 8;
inline constexpr size_t kMaxCidStringLength = 256;

// --- Validation without allocation ---

// did:method:identifier; method a-z only; identifier [A-Za-z0-9._:%-], not ending in ':' or '%';
// at most 2048 characters. Percent-encoding is not decoded (the spec does not require it).
Status ValidateDid(std::string_view text);
// A domain name: at least two '.'-separated segments of 1-63 [A-Za-z0-9-] not starting or ending
// with '-', the last not starting with a digit; at most 253 characters. Case-insensitive.
Status ValidateHandle(std::string_view text);
// Reversed domain authority then a name: at least three segments, at most 317 characters;
// authority segments as in a handle (the first may not start with a digit); the name is 1-63
// ASCII letters and digits starting with a letter.
Status ValidateNsid(std::string_view text);
// 1-512 characters of [A-Za-z0-9._:~-], and neither "." nor "..".
Status ValidateRecordKey(std::string_view text);
// The Lexicon AT URI: "at://" AUTHORITY [ "/" NSID [ "/" RKEY ] ]; the authority a DID or a
// handle; no query, no fragment, no trailing '/'; at most 8192 characters.
Status ValidateAtUri(std::string_view text);
// A DID (when it starts with "did:") or a handle.
Status ValidateAtIdentifier(std::string_view text);
// The Lexicon datetime: YYYY-MM-DDTHH:MM:SS[.fraction](Z|+HH:MM|-HH:MM), upper-case 'T' and 'Z',
// "-00:00" refused, at most 64 characters; and the value must be a real instant: month 01-12, a
// day that exists in that month, hour 00-23, minute and second 00-59 (no leap seconds), offset
// below 24:00, and not before 0000-01-01T00:00:00Z once normalised to UTC.
Status ValidateDatetime(std::string_view text);
// Only the shape of ValidateDatetime (digit counts, separators, timezone form), not the ranges.
// Some inputs pass this and still fail ValidateDatetime ("1985-00-12T23:20:50Z").
Status ValidateDatetimeSyntax(std::string_view text);
// Syntax-only check of a CID string: 8-256 characters of [A-Za-z0-9+=]; a CIDv0 ("Qm" and 46
// characters) is refused. It does not decode the CID (that is atproto/cid.hpp).
Status ValidateCid(std::string_view text);
// A BCP 47 language tag checked as the atproto vectors expect: a primary subtag of 2-3 lower-case
// letters, "i" (grandfathered) or "x"/"X" (private use), then '-'-separated subtags of 1-8 ASCII
// letters and digits; and no variant subtag or extension singleton repeated (case-insensitive).
Status ValidateLanguage(std::string_view text);
// Only the shape of ValidateLanguage, without the repeated-subtag rule.
Status ValidateLanguageSyntax(std::string_view text);
// A generic RFC 3986 URI as Lexicon's "uri" format: a scheme (a letter, then letters, digits, '+',
// '-', '.'), ':', then at least one printable non-space ASCII character; at most 8192 characters.
Status ValidateUri(std::string_view text);

// --- Dispatch by name (the launcher's `atfill syntax KIND VALUE`) ---

enum class SyntaxKind {
  kDid,
  kHandle,
  kNsid,
  kRecordKey,
  kTid,
  kAtUri,
  kDatetime,
  kCid,
  kAtIdentifier,
  kLanguage,
  kUri,
};

// Accepts "did", "handle", "nsid", "rkey", "tid", "aturi", "datetime", "cid", "atidentifier",
// "language", "uri", and the Lexicon format names "record-key", "at-uri", "at-identifier" (and
// "recordkey" as in the vector file names). Case-sensitive.
Result<SyntaxKind> ParseSyntaxKind(std::string_view name);
// The short name ("rkey", "aturi", ...) that ParseSyntaxKind accepts.
std::string_view SyntaxKindName(SyntaxKind kind);
// The full validator for `kind` (ValidateDid, ValidateTid, ...).
Status ValidateSyntax(SyntaxKind kind, std::string_view text);

// Renders one input byte for an error message: 'x' for printable ASCII, "a space", or "byte 0xF0".
std::string DescribeByte(char c);

// --- Value types ---

namespace internal {

// Shared by the string-holding value types: the text, and ordering by the text (byte-wise).
template <typename Derived>
class SyntaxString {
 public:
  const std::string& str() const { return str_; }
  bool empty() const { return str_.empty(); }

  friend bool operator==(const Derived& a, const Derived& b) { return a.str() == b.str(); }
  friend std::strong_ordering operator<=>(const Derived& a, const Derived& b) {
    return a.str() <=> b.str();
  }

 protected:
  SyntaxString() = default;
  explicit SyntaxString(std::string text) : str_(std::move(text)) {}

  std::string str_;
};

}  // namespace internal

class Did : public internal::SyntaxString<Did> {
 public:
  Did() = default;
  static Result<Did> Parse(std::string_view text);

  // "plc" for "did:plc:abc".
  std::string_view method() const;
  // Everything after the method's ':' ("abc" for "did:plc:abc").
  std::string_view identifier() const;
  bool is_plc() const { return method() == "plc"; }
  bool is_web() const { return method() == "web"; }
  // For a did:web, the host it names with "%3A" decoded to ':' (a port): "example.com",
  // "localhost:1234". Invalid when this is not did:web; Unsupported for a path-based did:web
  // (a ':' in the identifier), which atproto does not allow.
  Result<std::string> WebHost() const;

 private:
  explicit Did(std::string text) : SyntaxString(std::move(text)) {}
};

// Keeps the text as given; equality and ordering are on that text (case-sensitive). Compare
// Normalized() values to decide whether two handles name the same account.
class Handle : public internal::SyntaxString<Handle> {
 public:
  Handle() = default;
  static Result<Handle> Parse(std::string_view text);

  // The lower-case form, the canonical spelling of a handle.
  std::string Normalized() const;

 private:
  explicit Handle(std::string text) : SyntaxString(std::move(text)) {}
};

class Nsid : public internal::SyntaxString<Nsid> {
 public:
  Nsid() = default;
  static Result<Nsid> Parse(std::string_view text);

  // Everything before the last '.', in NSID order: "app.bsky.feed" for "app.bsky.feed.post".
  std::string_view authority() const;
  // The last segment: "post" for "app.bsky.feed.post".
  std::string_view name() const;
  // The authority as a lower-case domain name, segments reversed: "feed.bsky.app".
  std::string DomainAuthority() const;

 private:
  explicit Nsid(std::string text) : SyntaxString(std::move(text)) {}
};

class RecordKey : public internal::SyntaxString<RecordKey> {
 public:
  RecordKey() = default;
  static Result<RecordKey> Parse(std::string_view text);

 private:
  explicit RecordKey(std::string text) : SyntaxString(std::move(text)) {}
};

// Syntax-only CID string; see ValidateCid.
class CidString : public internal::SyntaxString<CidString> {
 public:
  CidString() = default;
  static Result<CidString> Parse(std::string_view text);

 private:
  explicit CidString(std::string text) : SyntaxString(std::move(text)) {}
};

class Language : public internal::SyntaxString<Language> {
 public:
  Language() = default;
  static Result<Language> Parse(std::string_view text);

  // The first subtag: "pt" for "pt-BR", "i" for "i-navajo", "x" for "x-private".
  std::string_view primary() const;

 private:
  explicit Language(std::string text) : SyntaxString(std::move(text)) {}
};

// A DID or a handle.
class AtIdentifier {
 public:
  AtIdentifier() = default;
  static Result<AtIdentifier> Parse(std::string_view text);
  AtIdentifier(Did did) : value_(std::move(did)) {}           // NOLINT(google-explicit-constructor)
  AtIdentifier(Handle handle) : value_(std::move(handle)) {}  // NOLINT(google-explicit-constructor)

  const std::string& str() const;
  bool empty() const { return str().empty(); }
  bool is_did() const { return std::holds_alternative<Did>(value_); }
  bool is_handle() const { return !is_did(); }
  // nullptr when the identifier is of the other kind.
  const Did* did() const { return std::get_if<Did>(&value_); }
  const Handle* handle() const { return std::get_if<Handle>(&value_); }

  friend bool operator==(const AtIdentifier& a, const AtIdentifier& b) {
    return a.str() == b.str();
  }
  friend std::strong_ordering operator<=>(const AtIdentifier& a, const AtIdentifier& b) {
    return a.str() <=> b.str();
  }

 private:
  std::variant<Handle, Did> value_;
};

// A Lexicon AT URI (see ValidateAtUri). Accessors return views into str().
class AtUri : public internal::SyntaxString<AtUri> {
 public:
  AtUri() = default;
  static Result<AtUri> Parse(std::string_view text);
  // "at://did/collection/rkey"; the parts are valid by construction, so this cannot fail.
  static AtUri ForRecord(const Did& did, const Nsid& collection, const RecordKey& rkey);
  // The text of ForRecord without building an AtUri.
  static std::string Format(const Did& did, const Nsid& collection, const RecordKey& rkey);
  // The same concatenation from strings the caller has already validated; nothing is checked.
  static std::string Format(std::string_view did, std::string_view collection,
                            std::string_view rkey);

  // The DID or handle after "at://".
  std::string_view authority() const;
  bool authority_is_did() const { return authority().starts_with("did:"); }
  bool has_collection() const { return authority_end_ < str_.size(); }
  bool has_rkey() const { return collection_end_ < str_.size(); }
  // Empty when absent.
  std::string_view collection() const;
  std::string_view rkey() const;

 private:
  AtUri(std::string text, uint32_t authority_end, uint32_t collection_end)
      : SyntaxString(std::move(text)),
        authority_end_(authority_end),
        collection_end_(collection_end) {}

  // Offsets into str_: the '/' after the authority and the '/' after the collection, or
  // str_.size() when that part is absent.
  uint32_t authority_end_ = 0;
  uint32_t collection_end_ = 0;
};

// A valid Lexicon datetime (see ValidateDatetime) with its instant. Equality is on the text;
// ordering is by instant, then by text, so "...Z" and "...+00:00" for one instant are ordered but
// not equal.
class Datetime {
 public:
  Datetime() = default;
  static Result<Datetime> Parse(std::string_view text);
  // The instant as "YYYY-MM-DDTHH:MM:SS.ffffffZ" (microsecond precision, UTC). OutOfRange when
  // the instant falls outside years 0000-9999.
  static Result<Datetime> FromUnixMicros(int64_t micros);

  const std::string& str() const { return str_; }
  bool empty() const { return str_.empty(); }
  // Microseconds since 1970-01-01T00:00:00Z; fraction digits past the sixth are truncated.
  int64_t unix_micros() const { return micros_; }

  friend bool operator==(const Datetime& a, const Datetime& b) { return a.str_ == b.str_; }
  friend std::strong_ordering operator<=>(const Datetime& a, const Datetime& b) {
    if (auto c = a.micros_ <=> b.micros_; c != 0) return c;
    return a.str_ <=> b.str_;
  }

 private:
  Datetime(std::string text, int64_t micros) : str_(std::move(text)), micros_(micros) {}

  std::string str_;
  int64_t micros_ = 0;
};

// Hash by text, for the std::hash specialisations below.
struct SyntaxStringHash {
  template <typename T>
  size_t operator()(const T& value) const noexcept {
    return std::hash<std::string>{}(value.str());
  }
};

}  // namespace atfill::atproto

template <>
struct std::hash<atfill::atproto::Did> : atfill::atproto::SyntaxStringHash {};
template <>
struct std::hash<atfill::atproto::Handle> : atfill::atproto::SyntaxStringHash {};
template <>
struct std::hash<atfill::atproto::Nsid> : atfill::atproto::SyntaxStringHash {};
template <>
struct std::hash<atfill::atproto::RecordKey> : atfill::atproto::SyntaxStringHash {};
template <>
struct std::hash<atfill::atproto::AtUri> : atfill::atproto::SyntaxStringHash {};
template <>
struct std::hash<atfill::atproto::AtIdentifier> : atfill::atproto::SyntaxStringHash {};
