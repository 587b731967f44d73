#include "tools/simnet/archive_server.hpp"

#include <boost/beast/http.hpp>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <optional>

#include "atproto/cbor.hpp"
#include "atproto/cid.hpp"
#include "atproto/json.hpp"
#include "atproto/syntax.hpp"
#include "atproto/value.hpp"
#include "base/json_writer.hpp"
#include "pipeline/event.hpp"
#include "sources/archive/archive.hpp"
#include "sources/archive/archive_http.hpp"
#include "sources/archive/archive_writer.hpp"
#include "sources/archive/jss.hpp"
#include "sources/jetstream/jetstream_frames.hpp"
#include "tools/simnet/http_util.hpp"
#include "tools/simnet/jetstream.hpp"

namespace atfill::simnet {
namespace {

namespace http = boost::beast::http;
using atproto::Value;
using Answer = ArchiveServer::Answer;

constexpr std::string_view kPrefix = "/xrpc/network.bsky.jetstream.";
constexpr std::string_view kMethods[] = {"listSegments", "planSnapshot", "getSegment", "getBlock"};

Answer Xrpc(int status, std::string_view error, std::string_view message) {
  JsonWriter w;
  w.BeginObject().Key("error").String(error);
  if (!message.empty()) w.Key("message").String(message);
  w.EndObject();
  Answer a;
  a.status = status;
  a.body = w.Take();
  return a;
}

Answer Bytes(std::string body) {
  Answer a;
  a.content_type = "application/octet-stream";
  a.body = std::move(body);
  return a;
}

std::string Hex16(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016" PRIx64, v);
  return buf;
}

std::string HttpDate(time_t t) {
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[64];
  const size_t n = std::strftime(buf, sizeof(buf), "%a, %d %b %Y %H:%M:%S GMT", &tm);
  return std::string(buf, n);
}

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::string_view Header(const http::request<http::string_body>& req, http::field f) {
  const auto v = req[f];
  return std::string_view(v.data(), v.size());
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

bool ParseU64(std::string_view s, uint64_t* out) {
  if (s.empty()) return false;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
  return ec == std::errc() && end == s.data() + s.size();
}

// Host name of a Host header, lower-cased, without the port.
std::string HostName(std::string_view host_header) {
  std::string name(host_header.substr(0, host_header.rfind(':')));
  for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return name;
}

Result<std::string> ReadRange(const std::string& path, uint64_t offset, uint64_t length) {
  std::ifstream in(path, std::ios::binary);
  std::string out(length, '\0');
  in.seekg(static_cast<std::streamoff>(offset));
  in.read(out.data(), static_cast<std::streamsize>(length));
  if (!in || static_cast<uint64_t>(in.gcount()) != length) {
    return Status::IoError("cannot read " + std::to_string(length) + " bytes at " +
                           std::to_string(offset) + " of " + path);
  }
  return out;
}

// Range / If-Range / If-None-Match over a representation of `size` bytes with ETag `etag`
// (unquoted). Sets the answer's status and headers; returns the byte range to send, or nullopt
// when the answer has no body (304, 416).
std::optional<std::pair<uint64_t, uint64_t>> ApplyRange(const http::request<http::string_body>& req,
                                                        const std::string& etag, uint64_t size,
                                                        Answer* a) {
  const std::string quoted = "\"" + etag + "\"";
  a->headers.emplace_back("ETag", quoted);
  a->headers.emplace_back("Accept-Ranges", "bytes");
  a->headers.emplace_back("Cache-Control", "public, no-cache");
  const std::string_view none_match = Header(req, http::field::if_none_match);
  if (!none_match.empty() &&
      (Trim(none_match) == "*" || none_match.find(quoted) != std::string_view::npos)) {
    a->status = 304;
    return std::nullopt;
  }
  std::string_view range = Trim(Header(req, http::field::range));
  const std::string_view if_range = Trim(Header(req, http::field::if_range));
  if (range.empty() || (!if_range.empty() && if_range != quoted) || !range.starts_with("bytes=") ||
      range.find(',') != std::string_view::npos) {
    return std::make_pair(uint64_t{0}, size);  // the whole representation
  }
  range.remove_prefix(6);
  const size_t dash = range.find('-');
  uint64_t first = 0, last = size == 0 ? 0 : size - 1;
  bool ok = dash != std::string_view::npos;
  if (ok && dash == 0) {  // the last N bytes
    uint64_t n = 0;
    ok = ParseU64(range.substr(1), &n) && n > 0 && size > 0;
    if (ok) first = size - std::min(n, size);
  } else if (ok) {
    ok = ParseU64(range.substr(0, dash), &first);
    if (ok && dash + 1 < range.size()) {
      uint64_t l = 0;
      ok = ParseU64(range.substr(dash + 1), &l) && l >= first;
      last = std::min(l, last);
    }
    ok = ok && first < size;
  }
  if (!ok) {
    a->status = 416;
    a->headers.emplace_back("Content-Range", "bytes */" + std::to_string(size));
    return std::nullopt;
  }
  a->status = 206;
  a->headers.emplace_back("Content-Range", "bytes " + std::to_string(first) + "-" +
                                               std::to_string(last) + "/" + std::to_string(size));
  return std::make_pair(first, last - first + 1);
}

// from_jetstream and from_repos write into a directory without segments.
Status CheckNoSegments(const ArchiveOptions& o) {
  std::error_code ec;
  if (std::filesystem::exists(o.dir, ec)) {
    for (const auto& entry : std::filesystem::directory_iterator(o.dir, ec)) {
      if (jss::ParseSegmentName(entry.path().filename().string()).ok()) {
        return Status::Invalid("archive directory " + o.dir + " already holds segments; " +
                               (o.from_repos ? "from_repos" : "from_jetstream") +
                               " needs an empty one");
      }
    }
  }
  return Status::OK();
}

// Every active account's repo as Jetstream stores a backfilled one (SPEC §4.4), from seq 1. The
// rows go straight to segment writers (ArchiveWriter would re-encode the record from its JSON):
// the payload is the very block RepoWriter puts in the repo, its CID checked against the record's.
Status WriteFromRepos(const Network& net, const ArchiveOptions& o) {
  std::error_code ec;
  std::filesystem::create_directories(o.dir, ec);
  if (ec) return Status::IoError("creating archive directory " + o.dir + ": " + ec.message());
  jss::SegmentWriterOptions wo;
  wo.rows_per_block = o.rows_per_block;
  uint64_t index = 0, seq = 0;
  std::optional<jss::SegmentWriter> open;
  const auto seal = [&]() -> Status {
    if (!open) return Status::OK();
    Status s = open->Seal();
    open.reset();
    ++index;
    return s;
  };
  const auto& accounts = net.accounts();
  const int64_t end_us = net.options().jetstream.start_time_us;
  for (const Account& a : accounts) {
    if (a.status != AccountStatus::kActive) continue;
    const int64_t witnessed_at =
        end_us - static_cast<int64_t>(accounts.size() - a.index) * int64_t{1000};
    ATFILL_ASSIGN_OR_RETURN(std::vector<GeneratedRecord> records, net.Records(a));
    for (const GeneratedRecord& r : records) {
      ATFILL_ASSIGN_OR_RETURN(Value value, atproto::JsonToValue(r.json));
      const atfill::Bytes block = atproto::EncodeCbor(value);
      if (atproto::Cid::Compute(atproto::Cid::Codec::kDagCbor, block) != r.cid) {
        return Status::Internal("simnet archive: the block of at://" + a.did + "/" + r.collection +
                                "/" + r.rkey + " does not have the record's CID");
      }
      jss::Row row;
      row.seq = ++seq;
      row.witnessed_at = witnessed_at;
      row.kind = jss::Kind::kCreate;
      row.did = a.did;
      row.collection = r.collection;
      row.rkey = r.rkey;
      row.rev = a.rev;
      row.payload = block;
      if (!open) {
        const std::string path = (std::filesystem::path(o.dir) / jss::SegmentName(index)).string();
        ATFILL_ASSIGN_OR_RETURN(auto writer, jss::SegmentWriter::Create(path, wo));
        open.emplace(std::move(writer));
      }
      ATFILL_RETURN_IF_ERROR(open->Append(row).WithContext("simnet archive: " + a.did));
      if (open->bytes_written() >= o.segment_bytes) ATFILL_RETURN_IF_ERROR(seal());
    }
  }
  return seal();
}

Status WriteFromJetstream(const JetstreamLog& log, const ArchiveOptions& o) {
  sources::ArchiveWriterOptions wo;
  wo.rows_per_block = o.rows_per_block;
  wo.segment_bytes = o.segment_bytes;
  ATFILL_ASSIGN_OR_RETURN(auto writer, sources::ArchiveWriter::Open(o.dir, wo));
  const uint64_t last = o.jetstream_through_seq == 0
                            ? log.size()
                            : std::min<uint64_t>(o.jetstream_through_seq, log.size());
  for (uint64_t seq = 1; seq <= last; ++seq) {
    ATFILL_ASSIGN_OR_RETURN(std::string text, log.FrameV2(seq));
    sources::JetstreamFrame frame;
    std::string kind;
    ATFILL_RETURN_IF_ERROR(sources::DecodeJetstreamV2(text, &frame, &kind)
                               .WithContext("simnet archive: seq " + std::to_string(seq)));
    ATFILL_RETURN_IF_ERROR(writer->Append(frame.payload, frame.time_us).status());
  }
  return writer->Finish();
}

}  // namespace

struct ArchiveServer::Segment {
  uint64_t index = 0;
  std::string name, path, checksum;
  uint64_t size = 0;
  std::shared_ptr<const jss::SegmentReader> reader;
};

ArchiveServer::~ArchiveServer() = default;

Result<std::unique_ptr<ArchiveServer>> ArchiveServer::Create(const ArchiveOptions& options,
                                                             const Network& network,
                                                             const JetstreamLog* log,
                                                             ByteView dictionary, uint16_t port) {
  ATFILL_RETURN_IF_ERROR(options.Validate());
  if (options.from_jetstream && log == nullptr) {
    return Status::Invalid("archive.from_jetstream needs a Jetstream");
  }
  if (options.from_repos || options.from_jetstream) {
    ATFILL_RETURN_IF_ERROR(CheckNoSegments(options));
  }
  if (options.from_repos) ATFILL_RETURN_IF_ERROR(WriteFromRepos(network, options));
  // ArchiveWriter appends after the repos' segments (next index, next seq).
  if (options.from_jetstream) ATFILL_RETURN_IF_ERROR(WriteFromJetstream(*log, options));
  std::unique_ptr<ArchiveServer> s(new ArchiveServer());
  s->options_ = options;
  s->port_ = port;
  s->dictionary_.assign(AsChars(dictionary));
  s->faults_ = options.faults;
  std::error_code ec;
  std::filesystem::directory_iterator it(options.dir, ec);
  if (ec) return Status::IoError("archive directory " + options.dir + ": " + ec.message());
  for (const auto& entry : it) {
    const std::string name = entry.path().filename().string();
    auto index = jss::ParseSegmentName(name);
    if (!index.ok()) continue;
    auto reader = jss::SegmentReader::Open(entry.path().string());
    if (!reader.ok()) continue;  // active or broken: never served
    Segment seg;
    seg.index = *index;
    seg.name = name;
    seg.path = entry.path().string();
    seg.checksum = Hex16(reader->header().checksum);
    seg.size = std::filesystem::file_size(entry.path(), ec);
    if (ec) return Status::IoError("size of " + seg.path + ": " + ec.message());
    seg.reader = std::make_shared<const jss::SegmentReader>(std::move(*reader));
    s->segments_.push_back(std::move(seg));
  }
  std::sort(s->segments_.begin(), s->segments_.end(),
            [](const Segment& a, const Segment& b) { return a.index < b.index; });
  return s;
}

void ArchiveServer::SetFaults(ArchiveFaults faults) {
  std::lock_guard lock(mu_);
  faults_ = std::move(faults);
  hits_.clear();
  buckets_.clear();
}

ArchiveStats ArchiveServer::stats() const {
  ArchiveStats s;
  s.requests = requests_;
  s.list_segments = list_segments_;
  s.plan_snapshots = plan_snapshots_;
  s.get_segments = get_segments_;
  s.get_blocks = get_blocks_;
  s.faults = faults_served_;
  s.key_rejections = key_rejections_;
  s.quota_rejections = quota_rejections_;
  s.bytes = bytes_;
  s.cdn_requests = cdn_requests_;
  s.authorization_elsewhere = authorization_elsewhere_;
  return s;
}

const ArchiveServer::Segment* ArchiveServer::Find(std::string_view name) const {
  for (const Segment& s : segments_) {
    if (s.name == name) return &s;
  }
  return nullptr;
}

std::optional<ArchiveFault> ArchiveServer::TakeFault(const std::string& target) {
  std::lock_guard lock(mu_);
  auto it = faults_.faults.find(target);
  if (it == faults_.faults.end()) return std::nullopt;
  uint32_t& hits = hits_[target];
  if (it->second.times != 0 && hits >= it->second.times) return std::nullopt;
  ++hits;
  return it->second;
}

std::optional<Answer> ArchiveServer::Handle(std::string_view host_header, const Request& req) {
  const std::string host = HostName(host_header);
  const bool authorized = !Header(req, http::field::authorization).empty();
  const std::string_view target(req.target().data(), req.target().size());
  const std::string_view path = target.substr(0, target.find('?'));
  if (host == "cdn.localhost") {
    ++requests_;
    ++cdn_requests_;
    if (authorized) ++authorization_elsewhere_;
    return Cdn(path);
  }
  std::string_view method;
  if (path.starts_with(kPrefix)) method = path.substr(kPrefix.size());
  const bool archive_method =
      std::find(std::begin(kMethods), std::end(kMethods), method) != std::end(kMethods);
  if (host != "archive.localhost" && !(host == "jetstream.localhost" && archive_method)) {
    if (authorized) ++authorization_elsewhere_;
    return std::nullopt;
  }
  ++requests_;
  Answer a = Archive(method, req);
  bytes_ += a.body.size();
  return a;
}

ArchiveServer::Answer ArchiveServer::Archive(std::string_view method, const Request& req) {
  const std::string_view authorization = Header(req, http::field::authorization);
  const bool keyed = method == "planSnapshot" || method == "getSegment" || method == "getBlock";
  if (!keyed && !authorization.empty()) ++authorization_elsewhere_;
  if (method == "getZstdDictionary") {
    if (req.method() != http::verb::get) {
      return Xrpc(405, "MethodNotAllowed", "getZstdDictionary is a GET query");
    }
    if (dictionary_.empty()) return Xrpc(404, "DictionaryNotFound", "no dictionary here");
    return Bytes(dictionary_);
  }
  ArchiveFaults settings;
  {
    std::lock_guard lock(mu_);
    settings.no_archive_status = faults_.no_archive_status;
    settings.required_key = faults_.required_key;
    settings.quota_bytes_per_second = faults_.quota_bytes_per_second;
  }
  if (settings.no_archive_status == 404) return Xrpc(404, "NotFound", "no archive here");
  const bool known =
      std::find(std::begin(kMethods), std::end(kMethods), method) != std::end(kMethods);
  if (settings.no_archive_status == 501 || !known) {
    return Xrpc(501, "MethodNotImplemented",
                "method not implemented: network.bsky.jetstream." + std::string(method));
  }
  const bool post = method == "planSnapshot";
  if (req.method() != (post ? http::verb::post : http::verb::get)) {
    return Xrpc(405, "MethodNotAllowed",
                std::string(method) + (post ? " is a POST procedure" : " is a GET query"));
  }
  if (method == "listSegments") ++list_segments_;
  if (method == "planSnapshot") ++plan_snapshots_;
  if (method == "getSegment") ++get_segments_;
  if (method == "getBlock") ++get_blocks_;

  if (keyed && !settings.required_key.empty()) {
    if (authorization.empty()) {
      ++key_rejections_;
      return Xrpc(401, "AuthRequired", "this archive requires a key");
    }
    if (authorization != "Bearer " + settings.required_key) {
      ++key_rejections_;
      return Xrpc(403, "Forbidden", "the key is not valid for this archive");
    }
  }
  const double rate = static_cast<double>(settings.quota_bytes_per_second);
  const auto advertise = [&](Answer a) {
    if (rate > 0) {
      a.headers.emplace_back(std::string(sources::kArchiveQuotaHeader),
                             std::to_string(settings.quota_bytes_per_second));
      std::lock_guard lock(mu_);
      buckets_[std::string(authorization)].tokens -= static_cast<double>(a.body.size());
    }
    return a;
  };
  if (rate > 0) {
    double debt = 0;
    {
      std::lock_guard lock(mu_);
      const int64_t now = NowNs();
      auto [it, fresh] = buckets_.try_emplace(std::string(authorization));
      Bucket& b = it->second;
      if (fresh) {
        b.tokens = rate;
      } else {
        b.tokens = std::min(rate, b.tokens + rate * static_cast<double>(now - b.last_ns) / 1e9);
      }
      b.last_ns = now;
      debt = -b.tokens;
    }
    if (debt > 0) {
      ++quota_rejections_;
      Answer a = Xrpc(429, "RateLimitExceeded", "byte quota exceeded");
      a.headers.emplace_back("Retry-After",
                             std::to_string(static_cast<int64_t>(std::ceil(debt / rate))));
      return advertise(std::move(a));
    }
  }

  const Target t = ParseTarget(std::string_view(req.target().data(), req.target().size()));
  std::optional<ArchiveFault> fault;
  if (method == "getBlock") {
    fault = TakeFault(t.Param("segment").value_or("") + "/" + t.Param("blockIndex").value_or(""));
  }
  if (!fault) fault = TakeFault(std::string(method));
  if (fault) {
    ++faults_served_;
    Answer a;
    switch (fault->kind) {
      case ArchiveFault::Kind::kStatus: {
        a = Xrpc(fault->status,
                 fault->status == 429   ? "RateLimitExceeded"
                 : fault->status == 503 ? "ServiceUnavailable"
                 : fault->status == 404 ? "NotFound"
                                        : "InternalServerError",
                 "simulated failure");
        if (fault->retry_after_s >= 0) {
          a.headers.emplace_back("Retry-After",
                                 fault->retry_after_date
                                     ? HttpDate(std::time(nullptr) + fault->retry_after_s)
                                     : std::to_string(fault->retry_after_s));
        }
        return advertise(std::move(a));
      }
      case ArchiveFault::Kind::kDrop:
        a.fault = Answer::Fault::kDrop;
        return a;
      case ArchiveFault::Kind::kRedirect:
        if (method == "getBlock") {
          a.status = 302;
          a.headers.emplace_back("Location", "http://cdn.localhost:" + std::to_string(port_) +
                                                 "/blocks/" + t.Param("segment").value_or("") +
                                                 "/" + t.Param("blockIndex").value_or(""));
          return advertise(std::move(a));
        }
        break;
      case ArchiveFault::Kind::kCorrupt:
      case ArchiveFault::Kind::kTruncate:
        break;
    }
    Answer real = method == "listSegments"   ? ListSegments(req)
                  : method == "planSnapshot" ? PlanSnapshot(req)
                  : method == "getSegment"   ? GetSegment(req)
                                             : GetBlock(req);
    if (fault->kind == ArchiveFault::Kind::kTruncate) {
      real.fault = Answer::Fault::kTruncate;
    } else if (fault->kind == ArchiveFault::Kind::kCorrupt && !real.body.empty()) {
      if (real.content_type == "application/json") {
        real.body.resize(real.body.size() / 2);
      } else {
        // Damage the middle and the end (the zstd content checksum) of the bytes.
        real.body[real.body.size() / 2] = static_cast<char>(real.body[real.body.size() / 2] ^ 0x5A);
        real.body.back() = static_cast<char>(real.body.back() ^ 0xFF);
      }
    }
    return advertise(std::move(real));
  }
  if (method == "listSegments") return advertise(ListSegments(req));
  if (method == "planSnapshot") return advertise(PlanSnapshot(req));
  if (method == "getSegment") return advertise(GetSegment(req));
  return advertise(GetBlock(req));
}

ArchiveServer::Answer ArchiveServer::Cdn(std::string_view path) {
  constexpr std::string_view kBlocks = "/blocks/";
  if (!path.starts_with(kBlocks)) return Xrpc(404, "NotFound", "not found");
  path.remove_prefix(kBlocks.size());
  const size_t slash = path.find('/');
  uint64_t index = 0;
  const Segment* s = slash == std::string_view::npos ? nullptr : Find(path.substr(0, slash));
  if (s == nullptr || !ParseU64(path.substr(slash + 1), &index) ||
      index >= s->reader->footer().blocks.size()) {
    return Xrpc(404, "NotFound", "no such block");
  }
  auto frame = s->reader->ReadFrame(index);
  if (!frame.ok()) return Xrpc(500, "InternalServerError", frame.status().ToString());
  return Bytes(std::move(*frame));
}

ArchiveServer::Answer ArchiveServer::ListSegments(const Request& req) {
  const Target t = ParseTarget(std::string_view(req.target().data(), req.target().size()));
  uint64_t limit = 100;
  if (auto text = t.Param("limit")) {
    int64_t v = 0;
    const auto [end, ec] = std::from_chars(text->data(), text->data() + text->size(), v);
    if (ec != std::errc() || end != text->data() + text->size() || v <= 0) {
      return Xrpc(400, "InvalidRequest", "limit must be a positive integer");
    }
    limit = std::min<uint64_t>(static_cast<uint64_t>(v), 1000);
  }
  limit = std::min<uint64_t>(limit, options_.max_list_page);
  uint64_t from = 0;
  if (auto cursor = t.Param("cursor"); cursor && !cursor->empty() && !ParseU64(*cursor, &from)) {
    return Xrpc(400, "InvalidRequest", "bad cursor");
  }
  JsonWriter w;
  w.BeginObject();
  std::vector<const Segment*> page;
  for (const Segment& s : segments_) {
    if (s.index < from) continue;
    if (page.size() == limit) {
      w.Key("cursor").String(std::to_string(s.index));
      break;
    }
    page.push_back(&s);
  }
  w.Key("segments").BeginArray();
  for (const Segment* s : page) {
    const jss::Header& h = s->reader->header();
    w.BeginObject()
        .Key("checksum")
        .String(s->checksum)
        .Key("eventCount")
        .Uint(h.event_count)
        .Key("index")
        .Uint(s->index)
        .Key("maxSeq")
        .Uint(h.max_seq)
        .Key("maxWitnessedAt")
        .Int(h.max_witnessed_at)
        .Key("minSeq")
        .Uint(h.min_seq)
        .Key("minWitnessedAt")
        .Int(h.min_witnessed_at)
        .Key("name")
        .String(s->name)
        .Key("sizeBytes")
        .Uint(s->size)
        .EndObject();
  }
  w.EndArray().EndObject();
  Answer a;
  a.body = w.Take();
  return a;
}

ArchiveServer::Answer ArchiveServer::PlanSnapshot(const Request& req) {
  auto parsed = atproto::JsonObjectToValue(req.body());
  if (!parsed.ok()) {
    return Xrpc(400, "InvalidRequest", "unparsable body: " + parsed.status().message());
  }
  const Value& body = *parsed;
  // A string array field (absent or null = empty); false when mistyped.
  const auto strings = [&](std::string_view key, std::vector<std::string>* out) {
    const Value* v = body.Find(key);
    if (v == nullptr || v->is_null()) return true;
    if (v->kind() != Value::Kind::kArray) return false;
    for (const Value& e : v->as_array()) {
      if (e.kind() != Value::Kind::kString) return false;
      out->push_back(e.as_string());
    }
    return true;
  };
  const auto seq = [&](std::string_view key, std::optional<uint64_t>* out) {
    const Value* v = body.Find(key);
    if (v == nullptr || v->is_null()) return true;
    if (v->kind() != Value::Kind::kInt || v->as_int() < 0) return false;
    *out = static_cast<uint64_t>(v->as_int());
    return true;
  };
  std::vector<std::string> kinds;
  sources::PlanRequest pr;
  std::optional<uint64_t> after, before;
  if (!strings("kinds", &kinds) || !strings("dids", &pr.dids) ||
      !strings("collections", &pr.collections) || !seq("afterSeq", &after) ||
      !seq("beforeSeq", &before)) {
    return Xrpc(400, "InvalidRequest", "a field has the wrong type or a negative seq");
  }
  if (kinds.size() > 4) return Xrpc(400, "InvalidRequest", "at most 4 kinds");
  if (pr.dids.size() > 10'000) return Xrpc(400, "InvalidRequest", "too many DIDs");
  if (pr.collections.size() > 100) return Xrpc(400, "InvalidRequest", "too many collections");
  bool commit = kinds.empty(), marker = kinds.empty();
  for (const std::string& k : kinds) {
    if (k == "commit") {
      commit = true;
    } else if (k == "account" || k == "identity" || k == "sync") {
      marker = true;
    } else {
      return Xrpc(400, "InvalidRequest", "unknown kind \"" + k + "\"");
    }
  }
  for (const std::string& d : pr.dids) {
    if (!atproto::ValidateDid(d).ok()) return Xrpc(400, "InvalidRequest", "invalid DID " + d);
  }
  for (const std::string& c : pr.collections) {
    const bool wildcard = c.size() > 2 && c.ends_with(".*");
    const std::string nsid = wildcard ? c.substr(0, c.size() - 2) + ".x" : c;
    if (!atproto::ValidateNsid(nsid).ok()) {
      return Xrpc(400, "InvalidRequest", "invalid collection " + c);
    }
  }
  if (!pr.collections.empty() && !commit) {
    return Xrpc(400, "InvalidRequest", "collections with kinds excluding commit");
  }
  if (before && *before <= after.value_or(0)) {
    return Xrpc(400, "InvalidRequest", "beforeSeq must be above afterSeq");
  }
  pr.commits = commit;
  pr.markers = marker;
  pr.after_seq = after.value_or(0);
  pr.before_seq = before.value_or(0);

  uint64_t tip = 0;
  for (const Segment& s : segments_) tip = std::max(tip, s.reader->header().max_seq);
  if (before) tip = std::min(tip, *before);

  // Work units in order: a whole segment, or one range of blocks.
  struct Unit {
    const Segment* segment;
    bool whole;
    uint32_t first, last;
    uint64_t max_seq;
  };
  std::vector<Unit> units;
  uint64_t examined = 0, matched = 0, blocks_matched = 0;
  for (const Segment& s : segments_) {
    const jss::Header& h = s.reader->header();
    if (h.max_seq <= pr.after_seq || (pr.before_seq != 0 && h.min_seq > pr.before_seq)) continue;
    ++examined;
    const std::vector<sources::PlannedBlock> blocks = sources::PlanSegment(*s.reader, pr);
    if (blocks.empty()) continue;
    ++matched;
    blocks_matched += blocks.size();
    const size_t total = s.reader->footer().blocks.size();
    if (static_cast<double>(blocks.size()) >=
        options_.whole_segment_threshold * static_cast<double>(total)) {
      units.push_back({&s, true, 0, 0, h.max_seq});
      continue;
    }
    for (size_t i = 0; i < blocks.size();) {
      size_t j = i;
      while (j + 1 < blocks.size() && blocks[j + 1].index == blocks[j].index + 1) ++j;
      units.push_back({&s, false, blocks[i].index, blocks[j].index, blocks[j].max_seq});
      i = j + 1;
    }
  }
  uint64_t planned_through = tip;
  if (options_.max_plan_entries != 0 && units.size() > options_.max_plan_entries) {
    units.resize(options_.max_plan_entries);
    planned_through = std::min(tip, units.back().max_seq);
  }
  JsonWriter w;
  w.BeginObject().Key("plannedThroughSeq").Uint(planned_through).Key("sealedTipSeq").Uint(tip);
  w.Key("segments").BeginArray();
  for (size_t i = 0; i < units.size();) {
    const Segment& s = *units[i].segment;
    const jss::Header& h = s.reader->header();
    const bool whole = units[i].whole;
    w.BeginObject();
    if (!whole) {
      w.Key("blocks").BeginArray();
      for (; i < units.size() && units[i].segment == &s; ++i) {
        w.BeginObject()
            .Key("first")
            .Uint(units[i].first)
            .Key("last")
            .Uint(units[i].last)
            .EndObject();
      }
      w.EndArray();
    } else {
      ++i;
    }
    w.Key("checksum").String(s.checksum).Key("index").Uint(s.index);
    w.Key("maxSeq").Uint(h.max_seq).Key("minSeq").Uint(h.min_seq);
    w.Key("mode").String(whole ? "segment" : "blocks").Key("name").String(s.name);
    w.EndObject();
  }
  w.EndArray();
  w.Key("stats").BeginObject().Key("blocksMatched").Uint(blocks_matched);
  w.Key("entries").Uint(units.size()).Key("segmentsExamined").Uint(examined);
  w.Key("segmentsMatched").Uint(matched).EndObject();
  w.EndObject();
  Answer a;
  a.body = w.Take();
  return a;
}

ArchiveServer::Answer ArchiveServer::GetSegment(const Request& req) {
  const Target t = ParseTarget(std::string_view(req.target().data(), req.target().size()));
  const std::optional<std::string> name = t.Param("name");
  if (!name || name->empty()) return Xrpc(400, "InvalidRequest", "missing name");
  if (!jss::ParseSegmentName(*name).ok()) return Xrpc(400, "InvalidRequest", "malformed name");
  const Segment* s = Find(*name);
  if (s == nullptr) return Xrpc(404, "SegmentNotFound", "no sealed segment " + *name);
  Answer a;
  a.content_type = "application/octet-stream";
  const auto range = ApplyRange(req, s->checksum, s->size, &a);
  if (!range) return a;
  auto bytes = ReadRange(s->path, range->first, range->second);
  if (!bytes.ok()) return Xrpc(500, "InternalServerError", bytes.status().message());
  a.body = std::move(*bytes);
  return a;
}

ArchiveServer::Answer ArchiveServer::GetBlock(const Request& req) {
  const Target t = ParseTarget(std::string_view(req.target().data(), req.target().size()));
  const std::optional<std::string> name = t.Param("segment");
  const std::optional<std::string> index_text = t.Param("blockIndex");
  uint64_t index = 0;
  if (!name || name->empty() || !index_text || !ParseU64(*index_text, &index)) {
    return Xrpc(400, "InvalidRequest", "missing or malformed segment or blockIndex");
  }
  if (!jss::ParseSegmentName(*name).ok()) return Xrpc(400, "InvalidRequest", "malformed segment");
  const Segment* s = Find(*name);
  if (s == nullptr) return Xrpc(404, "SegmentNotFound", "no sealed segment " + *name);
  if (index >= s->reader->footer().blocks.size()) {
    return Xrpc(404, "BlockNotFound", "block " + *index_text + " is past the segment's end");
  }
  auto frame = s->reader->ReadFrame(index);
  if (!frame.ok()) return Xrpc(500, "InternalServerError", frame.status().message());
  Answer a;
  a.content_type = "application/octet-stream";
  const auto range = ApplyRange(req, s->checksum + ":" + *index_text, frame->size(), &a);
  if (!range) return a;
  a.body = frame->substr(range->first, range->second);
  return a;
}

}  // namespace atfill::simnet
