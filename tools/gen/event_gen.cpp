#include "tools/gen/event_gen.hpp"

#include <zstd.h>

#include <cstdio>
#include <ctime>
#include <memory>

#include "atproto/json.hpp"
#include "atproto/syntax.hpp"
#include "base/json_writer.hpp"

namespace atfill::gen {
namespace {

constexpr const char* kCollections[] = {"app.bsky.feed.post",     "app.bsky.feed.like",
                                        "app.bsky.graph.follow",  "app.bsky.feed.repost",
                                        "app.bsky.actor.profile", "com.example.item"};
constexpr const char* kWords[] = {"atproto", "index",  "backfill", "stream", "record", "repo",
                                  "commit",  "merkle", "feed",     "label",  "relay",  "pds",
                                  "sky",     "blue",   "graph",    "like",   "post",   "reply"};

}  // namespace

Status EventGenOptions::Validate() const {
  if (dids == 0) return Status::Invalid("dids must be at least 1");
  if (run_length == 0) return Status::Invalid("run_length must be at least 1");
  if (collections == 0 || collections > 6) return Status::Invalid("collections must be 1 to 6");
  if (update_ratio < 0 || delete_ratio < 0 || account_ratio < 0 || bad_ratio < 0 ||
      update_ratio + delete_ratio + account_ratio + bad_ratio > 0.9) {
    return Status::Invalid("event ratios must be non-negative and sum to at most 0.9");
  }
  return Status::OK();
}

EventGenerator::EventGenerator(EventGenOptions options)
    : options_(options),
      rng_(options.seed),
      now_us_(options.start_time_us),
      accounts_(options.dids) {}

std::string EventGenerator::Did(uint32_t index) const {
  // did:plc identifiers are 24 base32 characters.
  static constexpr char kB32[] = "abcdefghijklmnopqrstuvwxyz234567";
  std::string id(24, 'a');
  uint64_t x = (static_cast<uint64_t>(index) + 1) * 0x9E3779B97F4A7C15ull ^ options_.seed;
  for (int i = 0; i < 24; ++i) {
    id[static_cast<size_t>(i)] = kB32[x & 31];
    x = (x >> 5) | (x << 59);
    if (i % 12 == 11) x ^= 0xD6E8FEB86659FD93ull * (index + 7);
  }
  return "did:plc:" + id;
}

std::string EventGenerator::Body(const std::string& collection, int64_t time_us) {
  JsonWriter w;
  w.BeginObject().Key("$type").String(collection);
  if (collection == "app.bsky.feed.like" || collection == "app.bsky.feed.repost") {
    w.Key("subject").BeginObject();
    w.Key("uri").String("at://" + Did(static_cast<uint32_t>(rng_() % options_.dids)) +
                        "/app.bsky.feed.post/3l" + std::to_string(rng_() % 1000000));
    w.Key("cid").String("bafyreie5cvv4h45feadgeuwhbcutmh6t2ceseocckahdoe6uat64zmz454");
    w.EndObject();
  } else if (collection == "app.bsky.graph.follow") {
    w.Key("subject").String(Did(static_cast<uint32_t>(rng_() % options_.dids)));
  }
  std::string text;
  while (text.size() + 120 < options_.body_bytes) {
    if (!text.empty()) text.push_back(' ');
    text += kWords[rng_() % (sizeof(kWords) / sizeof(kWords[0]))];
  }
  if (!text.empty()) w.Key("text").String(text);
  w.Key("langs").BeginArray().String("en").EndArray();
  w.Key("createdAt").String(atproto::Datetime::FromUnixMicros(time_us)->str());
  w.EndObject();
  return w.Take();
}

std::string EventGenerator::Commit(uint32_t did, const std::string& op,
                                   const std::string& collection, const std::string& rkey,
                                   const std::string& body) {
  Account& a = accounts_[did];
  a.last_us = std::max(a.last_us + 1, now_us_);
  const std::string rev = atproto::Tid::FromParts(static_cast<uint64_t>(a.last_us), 7)->str();
  JsonWriter w;
  w.BeginObject().Key("did").String(Did(did)).Key("time_us").Int(now_us_);
  w.Key("kind").String("commit").Key("commit").BeginObject();
  w.Key("rev").String(rev).Key("operation").String(op).Key("collection").String(collection);
  w.Key("rkey").String(rkey);
  if (op != "delete") {
    w.Key("record").Raw(body);
    w.Key("cid").String(atproto::CidOfRecord(body)->ToString());
  }
  w.EndObject().EndObject();
  return w.Take();
}

std::string EventGenerator::Next() {
  now_us_ += 100;
  ++counter_;
  const uint32_t did =
      options_.run_length <= 1
          ? static_cast<uint32_t>(rng_() % options_.dids)
          : static_cast<uint32_t>((counter_ - 1) / options_.run_length % options_.dids);
  Account& a = accounts_[did];
  const double roll = std::uniform_real_distribution<double>(0, 1)(rng_);
  double edge = options_.bad_ratio;
  if (roll < edge) {
    switch (rng_() % 3) {
      case 0:
        return "{\"did\":\"" + Did(did) + "\",\"kind\":\"commit\",\"commit\":{";  // cut short
      case 1:
        return "{\"did\":\"not a did\",\"time_us\":1,\"kind\":\"commit\",\"commit\":{\"rev\":"
               "\"3l2222222222a\",\"operation\":\"delete\",\"collection\":\"app.bsky.feed.post\","
               "\"rkey\":\"x\"}}";
      default: {
        // A record whose stated CID is another record's.
        std::string line = Commit(did, "create", kCollections[0],
                                  atproto::Tid::FromParts(static_cast<uint64_t>(now_us_), 9)->str(),
                                  Body(kCollections[0], now_us_));
        const size_t at = line.rfind("\"cid\":\"bafyrei");
        if (at != std::string::npos) line[at + 20] = line[at + 20] == 'a' ? 'b' : 'a';
        return line;
      }
    }
  }
  edge += options_.account_ratio;
  if (roll < edge) {
    static constexpr const char* kStatuses[] = {"takendown", "deactivated", "deleted"};
    const bool active = rng_() % 2 == 0;
    JsonWriter w;
    w.BeginObject().Key("did").String(Did(did)).Key("time_us").Int(now_us_);
    w.Key("kind").String("account").Key("account").BeginObject();
    w.Key("active").Bool(active).Key("did").String(Did(did)).Key("seq").Int(
        static_cast<int64_t>(counter_));
    if (!active) w.Key("status").String(kStatuses[rng_() % 3]);
    w.Key("time").String(atproto::Datetime::FromUnixMicros(now_us_)->str()).EndObject().EndObject();
    return w.Take();
  }
  edge += options_.update_ratio;
  if (roll < edge && !a.live.empty()) {
    const auto& [ci, rkey] = a.live[rng_() % a.live.size()];
    const std::string collection = kCollections[ci];
    return Commit(did, "update", collection, rkey, Body(collection, now_us_));
  }
  edge += options_.delete_ratio;
  if (roll < edge && !a.live.empty()) {
    const size_t i = rng_() % a.live.size();
    auto [ci, rkey] = a.live[i];
    a.live[i] = a.live.back();
    a.live.pop_back();
    return Commit(did, "delete", kCollections[ci], rkey, "");
  }
  const uint32_t ci = static_cast<uint32_t>(rng_() % options_.collections);
  const std::string collection = kCollections[ci];
  const std::string rkey =
      atproto::Tid::FromParts(static_cast<uint64_t>(now_us_) + did, static_cast<uint32_t>(ci))
          ->str();
  a.live.emplace_back(ci, rkey);
  return Commit(did, "create", collection, rkey, Body(collection, now_us_));
}

Status EventGenerator::WriteFile(const EventGenOptions& options, uint64_t count,
                                 const std::string& path, bool zstd) {
  ATFILL_RETURN_IF_ERROR(options.Validate());
  std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(path.c_str(), "wb"), &std::fclose);
  if (!f) return Status::IoError("cannot write " + path);
  std::unique_ptr<ZSTD_CCtx, size_t (*)(ZSTD_CCtx*)> cctx(zstd ? ZSTD_createCCtx() : nullptr,
                                                          &ZSTD_freeCCtx);
  std::string out;
  // Streams in pieces of about 1 MiB, so memory stays small however many events are written.
  auto put = [&](const std::string& text, bool last) -> Status {
    if (!zstd) {
      if (std::fwrite(text.data(), 1, text.size(), f.get()) != text.size()) {
        return Status::IoError("cannot write " + path);
      }
      return Status::OK();
    }
    ZSTD_inBuffer in{text.data(), text.size(), 0};
    for (;;) {
      out.resize(ZSTD_CStreamOutSize());
      ZSTD_outBuffer ob{out.data(), out.size(), 0};
      const size_t r =
          ZSTD_compressStream2(cctx.get(), &ob, &in, last ? ZSTD_e_end : ZSTD_e_continue);
      if (ZSTD_isError(r)) return Status::Internal(std::string("zstd: ") + ZSTD_getErrorName(r));
      if (std::fwrite(out.data(), 1, ob.pos, f.get()) != ob.pos) {
        return Status::IoError("cannot write " + path);
      }
      if (last ? r == 0 : in.pos == in.size) return Status::OK();
    }
  };
  EventGenerator gen(options);
  std::string text;
  for (uint64_t i = 0; i < count; ++i) {
    text += gen.Next();
    text.push_back('\n');
    if (text.size() >= (1 << 20)) {
      ATFILL_RETURN_IF_ERROR(put(text, false));
      text.clear();
    }
  }
  return put(text, true);
}

}  // namespace atfill::gen
