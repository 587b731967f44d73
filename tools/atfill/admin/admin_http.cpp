// The admin server's requests and answers: status codes and error bodies, routes matched, request
// bodies parsed, event-stream frames, and the HTTP/1.1 transport (targets decoded, answers
// serialised, chunks).
#include "tools/atfill/admin/admin_internal.hpp"

namespace atfill::admin {

int HttpStatusFor(const Status& s) {
  switch (s.code()) {
    case StatusCode::kNotFound:
      return 404;
    case StatusCode::kInvalid:
      return 400;
    case StatusCode::kUnsupported:
      return 409;
    case StatusCode::kUnavailable:
      return 503;
    default:
      return 500;
  }
}

void SendJson(Response& res, int status, std::string body) {
  res.status = status;
  res.set_header("Cache-Control", "no-store");
  res.set_header("X-Content-Type-Options", "nosniff");
  res.set_content(std::move(body), kJsonType);
}

void SendError(Response& res, int status, std::string_view message) {
  SendJson(res, status, ErrorJson(message));
}

void SendStatus(Response& res, const Status& s) {
  SendError(res, HttpStatusFor(s), s.message().empty() ? s.ToString() : s.message());
}

void SendUnauthorized(Response& res) {
  res.set_header("WWW-Authenticate", "Bearer realm=\"atfill admin\"");
  SendError(res, 401, "missing or wrong bearer token (Authorization: Bearer <token>)");
}

bool MatchPath(std::string_view pattern, std::string_view path, std::string* id) {
  for (;;) {
    const size_t p = pattern.find('/', 1);
    const size_t q = path.find('/', 1);
    const std::string_view pseg = pattern.substr(0, p);
    const std::string_view qseg = path.substr(0, q);
    if (pseg == "/{id}") {
      if (qseg.size() < 2) return false;
      if (id != nullptr) *id = std::string(qseg.substr(1));
    } else if (pseg != qseg) {
      return false;
    }
    if (p == std::string_view::npos || q == std::string_view::npos) {
      return p == std::string_view::npos && q == std::string_view::npos;
    }
    pattern.remove_prefix(p);
    path.remove_prefix(q);
  }
}

bool IsProtected(std::string_view path) {
  return path == "/admin" || path.starts_with("/admin/") || path == "/metrics" ||
         path.starts_with("/metrics/");
}

bool ParseUint(std::string_view text, uint64_t* out) {
  if (text.empty() || text.size() > 20) return false;
  uint64_t v = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return false;
    const uint64_t digit = static_cast<uint64_t>(c - '0');
    if (v > (UINT64_MAX - digit) / 10) return false;
    v = v * 10 + digit;
  }
  *out = v;
  return true;
}

bool ParseJobId(std::string_view text, uint64_t* id) { return ParseUint(text, id) && *id != 0; }

Status ParseStringArray(simdjson::dom::element value, std::string_view field,
                        Status (*validate)(std::string_view), std::vector<std::string>* out) {
  simdjson::dom::array array;
  if (value.get_array().get(array) != simdjson::SUCCESS) {
    return Status::Invalid("'" + std::string(field) + "' must be an array of strings");
  }
  size_t i = 0;
  for (simdjson::dom::element item : array) {
    std::string_view s;
    const std::string where = std::string(field) + "[" + std::to_string(i) + "]";
    if (item.get_string().get(s) != simdjson::SUCCESS) {
      return Status::Invalid("'" + where + "' must be a string");
    }
    if (Status st = validate(s); !st.ok()) return Status::Invalid(where + ": " + st.message());
    out->emplace_back(s);
    ++i;
  }
  return Status::OK();
}

Status ParseChoice(simdjson::dom::element value, std::string_view field,
                   std::initializer_list<std::string_view> choices, std::string* out) {
  std::string_view s;
  std::string names;
  for (std::string_view c : choices) names += (names.empty() ? "" : ", ") + std::string(c);
  if (value.get_string().get(s) != simdjson::SUCCESS) {
    return Status::Invalid("'" + std::string(field) + "' must be a string: one of " + names);
  }
  for (std::string_view c : choices) {
    if (s == c) {
      *out = std::string(s);
      return Status::OK();
    }
  }
  return Status::Invalid("'" + std::string(field) + "' is '" + std::string(s) + "', not one of " +
                         names);
}

Status ForEachField(
    std::string_view body,
    const std::function<Status(std::string_view key, simdjson::dom::element value)>& on_field) {
  simdjson::dom::parser parser;
  const simdjson::padded_string padded(body);
  simdjson::dom::element root;
  if (auto err = parser.parse(padded).get(root); err != simdjson::SUCCESS) {
    return Status::Invalid(std::string("the body is not JSON: ") + simdjson::error_message(err));
  }
  simdjson::dom::object object;
  if (root.get_object().get(object) != simdjson::SUCCESS) {
    return Status::Invalid("the body must be a JSON object");
  }
  std::set<std::string_view> seen;
  for (simdjson::dom::key_value_pair field : object) {
    if (!seen.insert(field.key).second) {
      return Status::Invalid("field '" + std::string(field.key) + "' appears twice");
    }
    ATFILL_RETURN_IF_ERROR(on_field(field.key, field.value));
  }
  return Status::OK();
}

Result<BackfillRequest> ParseBackfillRequest(std::string_view body) {
  BackfillRequest request;
  ATFILL_RETURN_IF_ERROR(ForEachField(body, [&](std::string_view key, auto value) -> Status {
    if (key == "collections") {
      return ParseStringArray(value, key, atproto::ValidateNsid, &request.collections);
    }
    if (key == "dids") return ParseStringArray(value, key, atproto::ValidateDid, &request.dids);
    if (key == "source")
      return ParseChoice(value, key, {"crawl", "auto", "replay"}, &request.source);
    if (key == "mode") return ParseChoice(value, key, {"listRecords", "getRepo"}, &request.mode);
    return Status::Invalid("unknown field '" + std::string(key) +
                           "' (known: collections, dids, source, mode)");
  }));
  if (request.collections.empty() && request.dids.empty()) {
    return Status::Invalid("give at least one of 'collections' or 'dids'");
  }
  return request;
}

Result<CollectionsRequest> ParseCollectionsRequest(std::string_view body) {
  CollectionsRequest request;
  ATFILL_RETURN_IF_ERROR(ForEachField(body, [&](std::string_view key, auto value) -> Status {
    if (key == "add") return ParseStringArray(value, key, atproto::ValidateNsid, &request.add);
    if (key == "remove") {
      return ParseStringArray(value, key, atproto::ValidateNsid, &request.remove);
    }
    if (key == "backfill" || key == "purge") {
      if (value.get(key == "backfill" ? request.backfill : request.purge) != simdjson::SUCCESS) {
        return Status::Invalid("field '" + std::string(key) + "' must be true or false");
      }
      return Status::OK();
    }
    return Status::Invalid("unknown field '" + std::string(key) +
                           "' (known: add, remove, backfill, purge)");
  }));
  if (request.add.empty() && request.remove.empty()) {
    return Status::Invalid("give at least one of 'add' or 'remove'");
  }
  return request;
}

bool EndsStream(state::JobStatus s) {
  return state::IsTerminal(s) || s == state::JobStatus::kPaused;
}

std::string SseEvent(std::string_view name, std::string_view json) {
  // JsonWriter writes one line (control characters in strings are escaped), as SSE needs.
  std::string out;
  out.reserve(name.size() + json.size() + 16);
  out.append("event: ").append(name).append("\ndata: ").append(json).append("\n\n");
  return out;
}

bool SameDigest(const Sha256Digest& a, const Sha256Digest& b) {
  volatile uint8_t diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff = static_cast<uint8_t>(diff | (a[i] ^ b[i]));
  return diff == 0;
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

std::string PercentDecode(std::string_view s, bool query) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size() && HexValue(s[i + 1]) >= 0 && HexValue(s[i + 2]) >= 0) {
      out += static_cast<char>(HexValue(s[i + 1]) * 16 + HexValue(s[i + 2]));
      i += 2;
    } else if (query && s[i] == '+') {
      out += ' ';
    } else {
      out += s[i];
    }
  }
  return out;
}

void SplitTarget(std::string_view target, Request* req) {
  const size_t q = target.find('?');
  req->path = PercentDecode(target.substr(0, q), false);
  if (q == std::string_view::npos) return;
  std::string_view rest = target.substr(q + 1);
  while (!rest.empty()) {
    const size_t amp = rest.find('&');
    const std::string_view pair = rest.substr(0, amp);
    rest.remove_prefix(amp == std::string_view::npos ? rest.size() : amp + 1);
    if (pair.empty()) continue;
    const size_t eq = pair.find('=');
    req->params.emplace(
        PercentDecode(pair.substr(0, eq), true),
        eq == std::string_view::npos ? std::string() : PercentDecode(pair.substr(eq + 1), true));
  }
}

std::string SerializeAnswer(const Response& res, bool keep_alive, bool head_only) {
  const auto status = static_cast<unsigned>(res.status);
  std::string out = "HTTP/1.1 " + std::to_string(status) + " ";
  const beast::string_view reason = http::obsolete_reason(http::int_to_status(status));
  out.append(reason.data(), reason.size());
  out += "\r\n";
  for (const auto& [name, value] : res.headers)
    out.append(name).append(": ").append(value) += "\r\n";
  if (res.stream) {
    out += "Transfer-Encoding: chunked\r\n";
  } else {
    out += "Content-Length: " + std::to_string(res.body.size()) + "\r\n";
  }
  if (!keep_alive) out += "Connection: close\r\n";
  out += "\r\n";
  if (!head_only && !res.stream) out += res.body;
  return out;
}

std::string Chunk(std::string_view data) {
  char size[20];
  std::snprintf(size, sizeof(size), "%zx\r\n", data.size());
  std::string out(size);
  out.append(data) += "\r\n";
  return out;
}

Response ProtocolError(int status) {
  Response res;
  const char* what = status == 413   ? "the request body is too large"
                     : status == 414 ? "the request URI is too long"
                     : status == 431 ? "the request head is too large"
                                     : "malformed request";
  SendError(res, status, what);
  return res;
}

}  // namespace atfill::admin
