// Lexicon: atproto's schema language (atproto.com/specs/lexicon). A catalog holds lexicon
// documents, each checked when it is added, and validates records against them.
//
// What a record must be, by field type: boolean, integer (minimum, maximum, enum, const), string
// (minLength/maxLength in UTF-8 bytes, minGraphemes/maxGraphemes in extended grapheme clusters,
// enum, const, format: at-identifier, at-uri, cid, datetime, did, handle, nsid, tid, record-key,
// uri, language; knownValues are advice and not enforced), bytes ({"$bytes": base64}, length
// bounds), cid-link ({"$link": cid}), blob (a typed blob or a legacy {cid, mimeType} one; accept
// patterns such as "image/*" and maxSize), unknown (any object that is not bytes, a link or a
// blob), array (item schema, length bounds), object (required, nullable; fields the schema does
// not name are allowed, as the spec asks for forward compatibility), ref (a def of this or another
// lexicon), union (the value's $type picks the member; an open union lets other types pass, a
// closed one does not).
//
// Records are validated on simdjson's DOM of their atproto JSON, as the CID check already parsed
// it (atproto/json.hpp), so a record is not parsed twice. A verdict names the path and the reason:
// "embed.images[2].alt: expected a string, got an integer".
//
// Thread-safety: a built LexiconCatalog is immutable and may validate on many threads at once.
// A Builder is thread-compatible.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.hpp"

namespace simdjson::dom {
class element;
}  // namespace simdjson::dom

namespace atfill::atproto {

namespace lexicon_internal {
struct Node;
struct Store;
}  // namespace lexicon_internal

struct LexiconVerdict {
  enum class Outcome : uint8_t {
    kValid,
    kInvalid,
    kUnknown,  // the catalog has no record lexicon for the collection
  };
  Outcome outcome = Outcome::kValid;
  // Where the record is wrong ("embed.images[2].alt"; empty for the record itself) and why.
  std::string path;
  std::string reason;

  bool valid() const { return outcome == Outcome::kValid; }
  // "embed.images[2].alt: expected a string, got an integer", or the reason alone at the top.
  std::string Describe() const;
};

class LexiconCatalog {
 public:
  class Builder;

  LexiconCatalog();
  ~LexiconCatalog();
  LexiconCatalog(LexiconCatalog&&) noexcept;
  LexiconCatalog& operator=(LexiconCatalog&&) noexcept;

  // Validates `record` (a parsed atproto JSON object) as a record of `collection` with key `rkey`
  // (not checked when empty). kUnknown when the catalog has no record lexicon for `collection`.
  // The record's $type must be the collection.
  LexiconVerdict Validate(std::string_view collection, std::string_view rkey,
                          const simdjson::dom::element& record) const;
  // The same from JSON text (parsed with this thread's parser); a document that is not JSON is
  // kInvalid.
  LexiconVerdict ValidateJson(std::string_view collection, std::string_view rkey,
                              std::string_view json) const;

  bool HasRecord(std::string_view nsid) const;
  // The NSIDs of the catalog's record types, sorted.
  std::vector<std::string> RecordTypes() const;
  size_t size() const;  // documents
  // References to definitions the catalog does not hold ("app.bsky.feed.post#x, from
  // app.bsky.feed.like"), sorted. A record that reaches one is invalid.
  const std::vector<std::string>& unresolved() const;

 private:
  std::unique_ptr<lexicon_internal::Store> store_;
};

// Collects lexicon documents, checking each as it comes, and builds catalogs of them. Keeps the
// documents' text, so a catalog can be rebuilt after one is added or removed at run time.
class LexiconCatalog::Builder {
 public:
  // One lexicon document (JSON text). Invalid when the document does not follow the Lexicon
  // language: the message names its id, the path inside it and the reason. A document with the
  // id of one already added replaces it. `origin` (a file name) prefixes errors when not empty.
  // *nsid, when given, receives the document's id.
  Status Add(std::string_view json, std::string_view origin = {}, std::string* nsid = nullptr);
  // A .json file, or every *.json file under a directory (recursively, in name order).
  Status AddPath(const std::filesystem::path& path);
  bool Remove(std::string_view nsid);
  bool Contains(std::string_view nsid) const;
  size_t size() const { return docs_.size(); }
  // The documents by NSID.
  const std::map<std::string, std::string, std::less<>>& documents() const { return docs_; }

  // A catalog of every document added. Each was checked by Add, so this fails only on an internal
  // inconsistency.
  Result<LexiconCatalog> Build() const;

 private:
  std::map<std::string, std::string, std::less<>> docs_;
};

// Checks one lexicon document on its own (refs to other lexicons are not resolved); *nsid
// receives its id.
Status CheckLexiconDocument(std::string_view json, std::string* nsid = nullptr);

// Extended grapheme clusters in UTF-8 `text` (Unicode's default rules, as the spec asks).
size_t CountGraphemes(std::string_view text);

}  // namespace atfill::atproto
