#include "sources/crawl/fetcher.hpp"

#include <simdjson.h>

#include <algorithm>
#include <cstdint>

#include "atproto/cid.hpp"
#include "atproto/json.hpp"
#include "atproto/json_check.hpp"
#include "atproto/syntax.hpp"
#include "base/strings.hpp"
#include "net/endpoint.hpp"

namespace atfill::sources {
namespace {

namespace od = simdjson::ondemand;
using pipeline::EventError;
using pipeline::RecordEvent;

// Error keys quote network input; a hostile uri or DID is cut to this many bytes.
constexpr size_t kMaxKeyBytes = 512;

// --- URLs ---

std::string_view TrimBase(std::string_view base) {
  while (!base.empty() && base.back() == '/') base.remove_suffix(1);
  return base;
}

// Builds "{base}/xrpc/{method}?k=v&k=v".
class UrlBuilder {
 public:
  UrlBuilder(std::string_view base, std::string_view method) {
    base = TrimBase(base);
    url_.reserve(base.size() + method.size() + 96);
    url_.append(base).append("/xrpc/").append(method);
  }
  UrlBuilder& Param(std::string_view name, std::string_view value) {
    url_.push_back(first_ ? '?' : '&');
    first_ = false;
    url_.append(name).push_back('=');
    net::AppendPercentEncoded(value, &url_);
    return *this;
  }
  UrlBuilder& Limit(uint32_t limit) {
    return limit == 0 ? *this : Param("limit", std::to_string(limit));
  }
  UrlBuilder& Cursor(std::string_view cursor) {
    return cursor.empty() ? *this : Param("cursor", cursor);
  }
  std::string Take() { return std::move(url_); }

 private:
  std::string url_;
  bool first_ = true;
};

// --- JSON ---

std::string_view TrimRight(std::string_view s) {
  while (!s.empty() &&
         (s.back() == ' ' || s.back() == '\n' || s.back() == '\r' || s.back() == '\t')) {
    s.remove_suffix(1);
  }
  return s;
}

std::string Clip(std::string_view s) { return std::string(s.substr(0, kMaxKeyBytes)); }

// The full syntax check of `value` (atproto/json_check.hpp); nesting deeper than kJsonMaxDepth
// sets *too_deep and stops the visit without an error.
simdjson::error_code CheckJson(od::value value, size_t depth, bool* too_deep) {
  return atproto::CheckJsonValue(value, depth, atproto::kJsonMaxDepth, too_deep);
}

// CheckJson for a value the caller ignores; nesting too deep there is no error.
simdjson::error_code SkipChecked(od::value value) {
  bool too_deep = false;
  return CheckJson(value, 0, &too_deep);
}

// Starts On Demand over a copy of `body` padded as simdjson needs, in this thread's parser. The
// document (and every string_view it hands out) stays valid until this thread's next Iterate.
simdjson::error_code Iterate(std::string_view body, od::document* doc) {
  thread_local od::parser parser;
  thread_local std::string padded;
  padded.assign(body);
  padded.reserve(body.size() + simdjson::SIMDJSON_PADDING);
  return parser.iterate(padded.data(), padded.size(), padded.capacity()).get(*doc);
}

// OK when nothing but whitespace follows the top-level value the caller iterated to its end.
bool AtEnd(od::document& doc) {
  const char* trailing = nullptr;
  return doc.current_location().get(trailing) != simdjson::SUCCESS;
}

Status NotJson(std::string_view what, simdjson::error_code e) {
  return Status::Invalid(std::string(what) + " is not valid JSON (" + simdjson::error_message(e) +
                         ")");
}

// Reads a top-level "cursor": a string, or null for none.
simdjson::error_code ReadCursor(od::value value, std::string* cursor, bool* bad_type) {
  od::json_type type;
  if (auto e = value.type().get(type)) return e;
  if (type == od::json_type::string) {
    std::string_view s;
    if (auto e = value.get_string().get(s)) return e;
    cursor->assign(s);
    return simdjson::SUCCESS;
  }
  *bad_type = type != od::json_type::null;
  return SkipChecked(value);
}

// The body shape shared by listRecords and the repo listings: an object with an array `array_key`
// whose elements `element` handles, and an optional string `cursor`.
template <typename ElementFn>
Status ParsePage(std::string_view what, std::string_view body, std::string_view array_key,
                 std::string* cursor, ElementFn&& element) {
  od::document doc;
  if (auto e = Iterate(body, &doc)) return NotJson(what, e);
  od::object top;
  if (auto e = doc.get_object().get(top)) {
    if (e == simdjson::INCORRECT_TYPE) {
      return Status::Invalid(std::string(what) + " is not a JSON object");
    }
    return NotJson(what, e);
  }
  bool has_array = false;
  for (auto field : top) {
    std::string_view key;
    if (auto e = field.unescaped_key().get(key)) return NotJson(what, e);
    od::value value;
    if (auto e = field.value().get(value)) return NotJson(what, e);
    if (key == "cursor") {
      bool bad_type = false;
      if (auto e = ReadCursor(value, cursor, &bad_type)) return NotJson(what, e);
      if (bad_type)
        return Status::Invalid(std::string(what) + " has a cursor that is not a string");
    } else if (key == array_key) {
      od::json_type type;
      if (auto e = value.type().get(type)) return NotJson(what, e);
      if (type != od::json_type::array) {
        return Status::Invalid(std::string(what) + " has a \"" + std::string(array_key) +
                               "\" that is not an array");
      }
      has_array = true;
      od::array array;
      if (auto e = value.get_array().get(array)) return NotJson(what, e);
      size_t index = 0;
      for (auto item : array) {
        od::value v;
        if (auto e = item.get(v)) return NotJson(what, e);
        if (auto e = element(v, index++)) return NotJson(what, e);
      }
    } else if (auto e = SkipChecked(value)) {
      return NotJson(what, e);
    }
  }
  if (!AtEnd(doc)) return Status::Invalid(std::string(what) + " has text after its JSON object");
  if (!has_array) {
    return Status::Invalid(std::string(what) + " has no \"" + std::string(array_key) + "\" array");
  }
  return Status::OK();
}

// --- Repo listings ---

Result<ReposPage> ParseRepos(std::string_view what, std::string_view body) {
  ReposPage page;
  auto element = [&](od::value entry, size_t index) -> simdjson::error_code {
    const auto position = [index] { return "repos[" + std::to_string(index) + "]"; };
    od::json_type type;
    if (auto e = entry.type().get(type)) return e;
    if (type != od::json_type::object) {
      if (auto e = SkipChecked(entry)) return e;
      page.errors.push_back({"bad_repo_entry", position(),
                             std::string(what) + " entry " + position() + " is not an object"});
      return simdjson::SUCCESS;
    }
    od::object object;
    if (auto e = entry.get_object().get(object)) return e;
    ListedRepo repo;
    bool has_did = false;
    std::string problem;  // the first field of the wrong type
    for (auto field : object) {
      std::string_view key;
      if (auto e = field.unescaped_key().get(key)) return e;
      od::value value;
      if (auto e = field.value().get(value)) return e;
      const bool known = key == "did" || key == "active" || key == "status" || key == "rev";
      if (!known) {
        if (auto e = SkipChecked(value)) return e;
        continue;
      }
      od::json_type vt;
      if (auto e = value.type().get(vt)) return e;
      if (vt == od::json_type::null && key != "did") {
        // Read, not left to On Demand: a value it skips is only matched for brackets.
        if (auto e = SkipChecked(value)) return e;
        continue;
      }
      if (key == "active" && vt == od::json_type::boolean) {
        if (auto e = value.get_bool().get(repo.active)) return e;
      } else if (key != "active" && vt == od::json_type::string) {
        std::string_view s;
        if (auto e = value.get_string().get(s)) return e;
        if (key == "did") {
          repo.did.assign(s);
          has_did = true;
        } else if (key == "status") {
          repo.status.assign(s);
        } else {
          repo.rev.assign(s);
        }
      } else {
        if (auto e = SkipChecked(value)) return e;
        if (key == "did") continue;  // reported below as a missing did
        if (problem.empty()) {
          problem = "its \"" + std::string(key) + "\" is not a " +
                    (key == "active" ? "boolean" : "string");
        }
      }
    }
    if (!has_did) {
      page.errors.push_back({"invalid_did", position(),
                             std::string(what) + " entry " + position() + " has no did string"});
    } else if (Status s = atproto::ValidateDid(repo.did); !s.ok()) {
      page.errors.push_back({"invalid_did", Clip(repo.did),
                             std::string(what) + " lists " + QuoteForMessage(repo.did) +
                                 ", which is not a valid DID: " + s.message()});
    } else if (!problem.empty()) {
      page.errors.push_back(
          {"bad_repo_entry", repo.did,
           std::string(what) + " entry for " + repo.did + " is malformed: " + problem});
    } else {
      page.repos.push_back(std::move(repo));
    }
    return simdjson::SUCCESS;
  };
  ATFILL_RETURN_IF_ERROR(ParsePage(what, body, "repos", &page.cursor, element));
  return page;
}

// --- listRecords ---

// The parts of one listRecords entry, as views into the parser's buffers.
struct RecordEntry {
  std::string_view uri, cid, body, created_at;
  bool has_uri = false, has_cid = false, has_value = false, value_is_object = false,
       too_deep = false;
};

simdjson::error_code ReadRecordEntry(od::object object, RecordEntry* entry) {
  for (auto field : object) {
    std::string_view key;
    if (auto e = field.unescaped_key().get(key)) return e;
    od::value value;
    if (auto e = field.value().get(value)) return e;
    od::json_type type;
    if (auto e = value.type().get(type)) return e;
    if ((key == "uri" || key == "cid") && type == od::json_type::string) {
      const bool is_uri = key == "uri";
      if (auto e = value.get_string().get(is_uri ? entry->uri : entry->cid)) return e;
      (is_uri ? entry->has_uri : entry->has_cid) = true;
    } else if (key == "value" && type == od::json_type::object) {
      entry->has_value = entry->value_is_object = true;
      od::object record;
      if (auto e = value.get_object().get(record)) return e;
      std::string_view raw;
      if (auto e = record.raw_json().get(raw)) return e;
      entry->body = TrimRight(raw);
      // raw_json only scanned the record: walk it again to check its syntax and find createdAt.
      bool not_empty = false;
      if (auto e = record.reset().get(not_empty)) return e;
      if (auto e = atproto::CheckRecordObject(record, atproto::kJsonMaxDepth, &entry->created_at,
                                              &entry->too_deep)) {
        return e;
      }
    } else {
      if (key == "value") {
        entry->has_value = true;
        entry->value_is_object = false;
      }
      if (auto e = SkipChecked(value)) return e;
    }
  }
  return simdjson::SUCCESS;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// URLs

std::string ListReposByCollectionUrl(std::string_view relay, std::string_view collection,
                                     uint32_t limit, std::string_view cursor) {
  return UrlBuilder(relay, "com.atproto.sync.listReposByCollection")
      .Param("collection", collection)
      .Limit(limit)
      .Cursor(cursor)
      .Take();
}

std::string ListReposUrl(std::string_view host, uint32_t limit, std::string_view cursor) {
  return UrlBuilder(host, "com.atproto.sync.listRepos").Limit(limit).Cursor(cursor).Take();
}

std::string ListRecordsUrl(std::string_view pds, std::string_view did, std::string_view collection,
                           uint32_t limit, std::string_view cursor) {
  return UrlBuilder(pds, "com.atproto.repo.listRecords")
      .Param("repo", did)
      .Param("collection", collection)
      .Limit(limit)
      .Cursor(cursor)
      .Take();
}

std::string GetRepoUrl(std::string_view pds, std::string_view did) {
  return UrlBuilder(pds, "com.atproto.sync.getRepo").Param("did", did).Take();
}

std::string GetRepoStatusUrl(std::string_view pds, std::string_view did) {
  return UrlBuilder(pds, "com.atproto.sync.getRepoStatus").Param("did", did).Take();
}

Result<RepoStatus> ParseRepoStatus(std::string_view did, std::string_view body) {
  simdjson::padded_string padded(body);
  od::parser parser;
  od::document doc;
  const std::string what = "getRepoStatus answer for " + std::string(did);
  if (parser.iterate(padded).get(doc) != simdjson::SUCCESS) {
    return Status::Corrupt(what + " is not JSON");
  }
  od::object object;
  if (doc.get_object().get(object) != simdjson::SUCCESS) {
    return Status::Corrupt(what + " is not a JSON object");
  }
  RepoStatus out;
  bool saw_did = false, saw_active = false;
  for (auto field : object) {
    std::string_view key;
    if (field.unescaped_key().get(key) != simdjson::SUCCESS) {
      return Status::Corrupt(what + " is not valid JSON");
    }
    od::value value;
    if (field.value().get(value) != simdjson::SUCCESS) {
      return Status::Corrupt(what + " is not valid JSON");
    }
    if (key == "did") {
      std::string_view v;
      if (value.get_string().get(v) != simdjson::SUCCESS || v != did) {
        return Status::Corrupt(what + " names another DID");
      }
      saw_did = true;
    } else if (key == "active") {
      if (value.get_bool().get(out.active) != simdjson::SUCCESS) {
        return Status::Corrupt(what + ": \"active\" is not a boolean");
      }
      saw_active = true;
    } else if (key == "status") {
      std::string_view v;
      if (value.get_string().get(v) != simdjson::SUCCESS) {
        return Status::Corrupt(what + ": \"status\" is not a string");
      }
      out.status = std::string(v);
    }
  }
  if (!saw_did || !saw_active) {
    return Status::Corrupt(what + " lacks \"" + (saw_did ? "active" : "did") + "\"");
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Repo listings

Result<ReposPage> ParseListReposByCollection(std::string_view body) {
  return ParseRepos("listReposByCollection response", body);
}

Result<ReposPage> ParseListRepos(std::string_view body) {
  return ParseRepos("listRepos response", body);
}

// ---------------------------------------------------------------------------------------------
// listRecords

Result<RecordsPage> ParseListRecordsPage(std::string_view did, std::string_view collection,
                                         std::string_view body, const FetchLimits& limits) {
  RecordsPage page;
  const std::string what =
      "listRecords response for " + std::string(did) + " " + std::string(collection);
  std::string prefix = "at://";
  prefix.append(did).append("/").append(collection).append("/");

  auto element = [&](od::value item, size_t index) -> simdjson::error_code {
    const auto description = [&] {
      return std::string(did) + "/" + std::string(collection) + " listRecords record " +
             std::to_string(index);
    };
    const auto bad = [&](std::string kind, std::string key, std::string message) {
      page.errors.push_back({std::move(kind), std::move(key), std::move(message)});
      return simdjson::SUCCESS;
    };
    od::json_type type;
    if (auto e = item.type().get(type)) return e;
    if (type != od::json_type::object) {
      if (auto e = SkipChecked(item)) return e;
      return bad("bad_record", description(),
                 "record " + std::to_string(index) + " of the " + what + " is not an object");
    }
    od::object object;
    if (auto e = item.get_object().get(object)) return e;
    RecordEntry entry;
    if (auto e = ReadRecordEntry(object, &entry)) return e;

    if (!entry.has_uri) {
      return bad("bad_record", description(),
                 "record " + std::to_string(index) + " of the " + what + " has no uri string");
    }
    const std::string key = Clip(entry.uri);
    if (!entry.uri.starts_with(prefix)) {
      return bad("bad_record", key,
                 "record uri " + QuoteForMessage(entry.uri, 200) + " is not in the repo " +
                     std::string(did) + " and collection " + std::string(collection) +
                     " that were asked for");
    }
    const std::string_view rkey = entry.uri.substr(prefix.size());
    if (Status s = atproto::ValidateRecordKey(rkey); !s.ok()) {
      return bad("bad_record", key,
                 "record uri " + QuoteForMessage(entry.uri, 200) +
                     " does not end in a valid record key: " + s.message());
    }
    if (!entry.has_cid) return bad("bad_record", key, "record has no cid string");
    auto cid = atproto::Cid::Parse(entry.cid);
    if (!cid.ok()) {
      return bad(
          "bad_record", key,
          "record cid " + QuoteForMessage(entry.cid) + " is not a CID: " + cid.status().message());
    }
    if (cid->codec() != atproto::Cid::Codec::kDagCbor) {
      return bad("bad_record", key,
                 "record cid " + cid->ToString() + " is not a dag-cbor CID, as records have");
    }
    if (!entry.has_value) return bad("bad_record", key, "record has no value");
    if (!entry.value_is_object) return bad("bad_record", key, "record value is not a JSON object");
    if (entry.body.size() > limits.max_record_bytes) {
      return bad("oversize_record", key,
                 "record is " + std::to_string(entry.body.size()) +
                     " bytes of JSON, more than the limit of " +
                     std::to_string(limits.max_record_bytes));
    }
    if (entry.too_deep) {
      return bad("bad_record", key,
                 "record value nests arrays and objects more than " +
                     std::to_string(atproto::kJsonMaxDepth) + " deep");
    }
    RecordEvent& r = page.records.emplace_back();
    r.did.assign(did);
    r.collection.assign(collection);
    r.rkey.assign(rkey);
    r.operation = pipeline::Operation::kCreate;
    r.cid = *cid;
    r.body.assign(entry.body);
    r.created_at.assign(entry.created_at);
    r.origin = pipeline::Origin::kCrawl;
    return simdjson::SUCCESS;
  };
  ATFILL_RETURN_IF_ERROR(ParsePage(what, body, "records", &page.cursor, element));
  return page;
}

}  // namespace atfill::sources
