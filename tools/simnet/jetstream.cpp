#include "tools/simnet/jetstream.hpp"
#include "tools/simnet/mix.hpp"

#include <zdict.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <deque>
#include <map>

#include "atproto/json.hpp"
#include "atproto/syntax.hpp"
#include "atproto/tid.hpp"
#include "base/encoding.hpp"
#include "base/json_writer.hpp"

namespace atfill::simnet {
namespace {

constexpr std::string_view kPayloadType = "network.bsky.jetstream.subscribeEvents#";
// Upstream (relay) seqs of #identity and #account events: this plus the Jetstream seq.
constexpr int64_t kRelaySeqBase = 5'000'000'000;
constexpr uint64_t kMaxEvents = 10'000'000;

enum Tag : uint64_t {
  kTagLog = 0x1E75,
  kTagKind,
  kTagTime,
  kTagRecord,
};

uint64_t Draw(uint64_t seed, uint64_t tag, uint64_t a) { return Mix(Mix(seed ^ Mix(tag)) ^ a); }

// splitmix64 over a seed: the random choices of one event or one record.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t Next() { return Mix(state_ += 0x9E3779B97F4A7C15ull); }
  uint64_t Below(uint64_t n) { return n == 0 ? 0 : Next() % n; }
  double Unit() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }

 private:
  uint64_t state_;
};

// A JSON object written key by key; the caller passes keys in sorted order.
class Obj {
 public:
  explicit Obj(std::string* out) : out_(out) { out_->push_back('{'); }
  Obj& Key(std::string_view key) {
    if (!first_) out_->push_back(',');
    first_ = false;
    AppendJsonString(key, out_, JsonEscape::kGo);
    out_->push_back(':');
    return *this;
  }
  Obj& Str(std::string_view key, std::string_view value) {
    Key(key);
    AppendJsonString(value, out_, JsonEscape::kGo);
    return *this;
  }
  Obj& Num(std::string_view key, int64_t value) {
    Key(key);
    *out_ += std::to_string(value);
    return *this;
  }
  Obj& Bool(std::string_view key, bool value) {
    Key(key);
    *out_ += value ? "true" : "false";
    return *this;
  }
  Obj& Raw(std::string_view key, std::string_view json) {
    Key(key);
    *out_ += json;
    return *this;
  }
  void End() { out_->push_back('}'); }

 private:
  std::string* out_;
  bool first_ = true;
};

// RFC 3339 with microseconds, as the v2 envelope's `time`.
std::string MicrosTime(int64_t us) {
  Result<atproto::Datetime> t = atproto::Datetime::FromUnixMicros(us);
  return t.ok() ? t->str() : std::string();
}

// RFC 3339 with milliseconds, as relays and clients write times.
std::string MillisTime(int64_t us) {
  std::string s = MicrosTime(us);
  if (s.size() == 27) s = s.substr(0, 23) + "Z";
  return s;
}

constexpr const char* kWords[] = {
    "jetstream", "firehose", "cursor", "replay", "record", "repo",    "commit",     "feed",
    "label",     "relay",    "pds",    "sky",    "blue",   "graph",   "like",       "post",
    "the",       "a",        "of",     "and",    "today",  "network", "<3",         "R&D",
    "a<b>c",     "🦋",     "naïve",  "\"ok\"", "back\\", "tab\tx",  "line\nbreak"};

std::string Words(Rng& rng, size_t min_words, size_t extra) {
  std::string text;
  const size_t count = min_words + rng.Below(extra + 1);
  for (size_t i = 0; i < count; ++i) {
    if (!text.empty()) text.push_back(' ');
    text += kWords[rng.Below(std::size(kWords))];
  }
  return text;
}

std::string BlobJson(Rng& rng, std::string_view mime) {
  Bytes content(16);
  for (uint8_t& b : content) b = static_cast<uint8_t>(rng.Next());
  const atproto::Cid ref = atproto::Cid::Compute(atproto::Cid::Codec::kRaw, content);
  std::string out;
  Obj o(&out);
  o.Str("$type", "blob").Str("mimeType", mime);
  std::string link;
  Obj(&link).Str("$link", ref.ToString()).End();
  o.Raw("ref", link).Num("size", static_cast<int64_t>(1000 + rng.Below(900'000)));
  o.End();
  return out;
}

}  // namespace

Status JetstreamOptions::Validate() const {
  if (events > kMaxEvents) {
    return Status::Invalid("jetstream events must be 0..10000000, not " + std::to_string(events));
  }
  if (!std::isfinite(events_per_second) || events_per_second < 0 || events_per_second > 1e7) {
    return Status::Invalid("jetstream events_per_second must be 0..10000000");
  }
  if (published_at_start && *published_at_start > events) {
    return Status::Invalid("jetstream published_at_start exceeds the events");
  }
  if (events_per_second == 0 && published_at_start && *published_at_start != events) {
    return Status::Invalid(
        "jetstream published_at_start must be every event when events_per_second is 0 (nothing "
        "would publish the rest)");
  }
  if ((burst_every == 0) != (burst_size == 0)) {
    return Status::Invalid("jetstream burst_every and burst_size are set together");
  }
  if (burst_every > 0 && events_per_second == 0) {
    return Status::Invalid("jetstream bursts need events_per_second > 0");
  }
  if (interval_us < 1 || interval_us > 1'000'000'000) {
    return Status::Invalid("jetstream interval_us must be 1..1000000000");
  }
  // Timestamp cursors are told from seq cursors by being >= 1e15; TIDs hold 53 bits.
  const double end = static_cast<double>(start_time_us) +
                     (static_cast<double>(events) + 2) * static_cast<double>(interval_us);
  if (start_time_us < 1'000'000'000'000'000 || end >= 0x1.0p53) {
    return Status::Invalid(
        "jetstream start_time_us must be >= 1e15 and the log must end before 2^53 us");
  }
  const auto share = [](double v) { return v >= 0 && v <= 1; };
  if (!share(update_share) || !share(delete_share) || !share(identity_share) ||
      !share(account_share) || update_share + delete_share + identity_share + account_share > 1) {
    return Status::Invalid("jetstream event shares must be within 0..1 and add up to at most 1");
  }
  if (!share(sync_share) ||
      update_share + delete_share + identity_share + account_share + sync_share > 1) {
    return Status::Invalid(
        "jetstream sync_share must be within 0..1 and the shares add up to at most 1");
  }
  if (!share(false_delete_share)) {
    return Status::Invalid("jetstream false_delete_share must be within 0..1");
  }
  if (!share(disconnect_probability)) {
    return Status::Invalid("jetstream disconnect_probability must be within 0..1");
  }
  if (slow_drop_grace_ms < 0 || slow_drop_grace_ms > 600'000) {
    return Status::Invalid("jetstream slow_drop_grace_ms must be 0..600000");
  }
  if (send_buffer_bytes < 0) return Status::Invalid("jetstream send_buffer_bytes must be >= 0");
  // zstd reserves IDs below 32768 and from 2^31.
  const auto id_ok = [](uint32_t id) { return id >= 32768 && id < (1u << 31); };
  if (!id_ok(v1_dictionary_id) || !id_ok(v2_dictionary_id) ||
      v1_dictionary_id == v2_dictionary_id) {
    return Status::Invalid("jetstream dictionary IDs must differ and be within 32768..2147483647");
  }
  return Status::OK();
}

Result<std::unique_ptr<JetstreamLog>> JetstreamLog::Generate(const Network& net,
                                                             const JetstreamOptions& options,
                                                             uint64_t salt) {
  ATFILL_RETURN_IF_ERROR(options.Validate());
  const std::vector<std::string>& collections = net.options().collections;
  if (collections.empty() || collections.size() > 255) {
    return Status::Invalid("the jetstream needs 1..255 collections");
  }
  std::unique_ptr<JetstreamLog> log(new JetstreamLog());
  log->net_ = &net;
  log->options_ = options;
  log->seed_ = Mix(net.options().seed ^ Mix(kTagLog + salt));
  log->published_at_start_ =
      options.published_at_start.value_or(options.events_per_second > 0 ? 0 : options.events);

  const std::vector<Account>& accounts = net.accounts();
  const uint64_t n_accounts = accounts.size();
  struct State {
    AccountStatus status;
    uint64_t handle_version = 0;
    std::vector<uint64_t> records;  // creates, possibly deleted since
    // Falsely reported deleted: no #account event names it again, so that its PDS's status (what
    // getRepoStatus says at any later time) stays the one it had at the false report.
    bool frozen = false;
  };
  std::vector<State> state(n_accounts);
  for (size_t i = 0; i < n_accounts; ++i) state[i].status = accounts[i].status;
  const uint64_t n = options.events;
  std::vector<uint8_t> alive(n + 1, 0);
  std::vector<uint64_t> pool;  // creates, lazily pruned of dead ones
  log->events_.assign(n + 1, JetstreamEvent{});

  log->status_changes_.assign(n_accounts, {});
  const auto set_status = [&](JetstreamEvent* e, uint32_t account, AccountStatus status) {
    e->kind = JetstreamKind::kAccount;
    e->account = account;
    e->status = status;
    log->status_changes_[account].push_back(static_cast<uint64_t>(e - log->events_.data()));
    State& s = state[account];
    s.status = status;
    if (status == AccountStatus::kTakendown || status == AccountStatus::kDeleted) {
      for (uint64_t r : s.records) alive[r] = 0;
      s.records.clear();
    }
  };

  // CreateResync rows a #sync scheduled, emitted one per seq before anything else.
  std::deque<uint64_t> resync;  // creates (targets) of the synced account's current records
  for (uint64_t seq = 1; seq <= n; ++seq) {
    Rng rng(Draw(log->seed_, kTagKind, seq));
    JetstreamEvent& e = log->events_[seq];
    if (!resync.empty()) {
      const JetstreamEvent& created = log->events_[resync.front()];
      e.kind = JetstreamKind::kCreateResync;
      e.target = resync.front();
      e.account = created.account;
      e.collection = created.collection;
      resync.pop_front();
      continue;
    }
    const double u = rng.Unit();
    bool done = false;
    const double before_sync = options.update_share + options.delete_share +
                               options.identity_share + options.account_share;
    if (options.sync_share > 0 && u >= before_sync && u < before_sync + options.sync_share) {
      // A #sync of an active account with records: one record vanishes without a delete.
      for (int attempt = 0; attempt < 8 && !done; ++attempt) {
        const auto a = static_cast<uint32_t>(rng.Below(n_accounts));
        State& s = state[a];
        if (s.status != AccountStatus::kActive) continue;
        std::vector<uint64_t> current;
        for (uint64_t r : s.records) {
          if (alive[r]) current.push_back(r);
        }
        if (current.empty()) continue;
        const size_t lost = rng.Below(current.size());
        alive[current[lost]] = 0;
        current.erase(current.begin() + static_cast<std::ptrdiff_t>(lost));
        s.records = current;
        e.kind = JetstreamKind::kSync;
        e.account = a;
        resync.assign(current.begin(), current.end());
        done = true;
      }
      if (done) continue;
    }
    if (u < options.update_share + options.delete_share) {
      for (int attempt = 0; attempt < 8 && !pool.empty() && !done; ++attempt) {
        const size_t i = rng.Below(pool.size());
        const uint64_t target = pool[i];
        if (!alive[target]) {
          pool[i] = pool.back();
          pool.pop_back();
          continue;
        }
        const JetstreamEvent& created = log->events_[target];
        if (state[created.account].status != AccountStatus::kActive) continue;
        e.kind = u < options.update_share ? JetstreamKind::kUpdate : JetstreamKind::kDelete;
        e.target = target;
        e.account = created.account;
        e.collection = created.collection;
        if (e.kind == JetstreamKind::kDelete) {
          alive[target] = 0;
          pool[i] = pool.back();
          pool.pop_back();
        }
        done = true;
      }
    } else if (u < options.update_share + options.delete_share + options.identity_share) {
      e.kind = JetstreamKind::kIdentity;
      e.account = static_cast<uint32_t>(rng.Below(n_accounts));
      e.target = ++state[e.account].handle_version;
      done = true;
    } else if (u < options.update_share + options.delete_share + options.identity_share +
                       options.account_share) {
      for (int attempt = 0; attempt < 8 && !done; ++attempt) {
        const auto a = static_cast<uint32_t>(rng.Below(n_accounts));
        if (state[a].status == AccountStatus::kDeleted || state[a].frozen) continue;
        AccountStatus next = AccountStatus::kActive;
        if (state[a].status == AccountStatus::kActive) {
          const double r = rng.Unit();
          next = r < 0.7   ? AccountStatus::kDeactivated
                 : r < 0.9 ? AccountStatus::kTakendown
                           : AccountStatus::kDeleted;
        }
        // Drawn only when asked for, so that logs without false deletes stay as they were.
        if (next == AccountStatus::kDeleted && options.false_delete_share > 0 &&
            rng.Unit() < options.false_delete_share) {
          e.kind = JetstreamKind::kAccount;
          e.account = a;
          e.status = next;
          e.false_report = true;
          state[a].frozen = true;
          done = true;
          continue;
        }
        set_status(&e, a, next);
        done = true;
      }
    }
    if (done) continue;
    // A create by an active account.
    for (int attempt = 0; attempt < 16 && !done; ++attempt) {
      const auto a = static_cast<uint32_t>(rng.Below(n_accounts));
      if (state[a].status != AccountStatus::kActive) continue;
      e.kind = JetstreamKind::kCreate;
      e.account = a;
      e.collection = static_cast<uint8_t>(rng.Below(collections.size()));
      e.target = seq;
      alive[seq] = 1;
      pool.push_back(seq);
      state[a].records.push_back(seq);
      done = true;
    }
    if (done) continue;
    // Few active accounts: one comes back, or (all deleted) someone's handle changes.
    const uint64_t from = rng.Below(n_accounts);
    for (uint64_t k = 0; k < n_accounts && !done; ++k) {
      const auto a = static_cast<uint32_t>((from + k) % n_accounts);
      if (state[a].status == AccountStatus::kDeleted || state[a].frozen) continue;
      set_status(&e, a, AccountStatus::kActive);
      done = true;
    }
    if (!done) {
      e.kind = JetstreamKind::kIdentity;
      e.account = static_cast<uint32_t>(from);
      e.target = ++state[e.account].handle_version;
    }
  }
  return log;
}

int64_t JetstreamLog::TimeUs(uint64_t seq) const {
  const auto interval = static_cast<uint64_t>(options_.interval_us);
  return options_.start_time_us + static_cast<int64_t>(seq * interval) +
         static_cast<int64_t>(Draw(seed_, kTagTime, seq) % interval);
}

uint64_t JetstreamLog::SeqAtTime(int64_t time_us) const {
  uint64_t lo = 1, hi = size() + 1;  // the answer is in [lo, hi]
  while (lo < hi) {
    const uint64_t mid = lo + (hi - lo) / 2;
    if (TimeUs(mid) >= time_us) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  return lo;
}

const std::string& JetstreamLog::Did(uint64_t seq) const {
  return net_->accounts()[events_[seq].account].did;
}

bool JetstreamLog::IsCommit(uint64_t seq) const {
  const JetstreamKind k = events_[seq].kind;
  return k == JetstreamKind::kCreate || k == JetstreamKind::kUpdate ||
         k == JetstreamKind::kDelete || k == JetstreamKind::kCreateResync;
}

const std::string& JetstreamLog::Collection(uint64_t seq) const {
  return net_->options().collections[events_[seq].collection];
}

std::string JetstreamLog::Rkey(uint64_t seq) const {
  const JetstreamEvent& e = events_[seq];
  // The create's time with another clock id than its rev: unique within the account.
  return atproto::Tid::FromValue(static_cast<uint64_t>(TimeUs(e.target)) << 10 |
                                 ((e.account + 1) % 1024))
      .str();
}

std::string JetstreamLog::Uri(uint64_t seq) const {
  return "at://" + Did(seq) + "/" + Collection(seq) + "/" + Rkey(seq);
}

std::string JetstreamLog::Rev(uint64_t seq) const {
  return atproto::Tid::FromValue(static_cast<uint64_t>(TimeUs(seq)) << 10 |
                                 (events_[seq].account % 1024))
      .str();
}

std::string JetstreamLog::Handle(uint64_t seq) const {
  const JetstreamEvent& e = events_[seq];
  char buf[64];
  std::snprintf(buf, sizeof(buf), "user-%04u-v%llu.simnet.test", e.account + 1,
                static_cast<unsigned long long>(e.target));
  return buf;
}

Result<std::string> JetstreamLog::Record(uint64_t seq) const {
  if (seq == 0 || seq > size() || !IsCommit(seq) || events_[seq].kind == JetstreamKind::kDelete) {
    return Status::Invalid("jetstream seq " + std::to_string(seq) + " writes no record");
  }
  Rng rng(Draw(seed_, kTagRecord, seq));
  const std::string& collection = Collection(seq);
  const std::string created_at =
      MillisTime(TimeUs(seq) - static_cast<int64_t>(rng.Below(3'000'000)));
  const auto& accounts = net_->accounts();
  std::string out;
  Obj o(&out);
  o.Str("$type", collection);
  if (collection == "app.bsky.feed.like" || collection == "app.bsky.feed.repost") {
    const std::string uri = "at://" + accounts[rng.Below(accounts.size())].did +
                            "/app.bsky.feed.post/" + atproto::Tid::FromValue(rng.Next() >> 1).str();
    const atproto::Cid cid = atproto::Cid::Compute(atproto::Cid::Codec::kDagCbor, AsBytes(uri));
    std::string subject;
    Obj(&subject).Str("cid", cid.ToString()).Str("uri", uri).End();
    o.Str("createdAt", created_at).Raw("subject", subject);
  } else if (collection == "app.bsky.graph.follow" || collection == "app.bsky.graph.block") {
    o.Str("createdAt", created_at).Str("subject", accounts[rng.Below(accounts.size())].did);
  } else if (collection == "app.bsky.actor.profile") {
    if (rng.Below(2) == 0) o.Raw("avatar", BlobJson(rng, "image/png"));
    o.Str("createdAt", created_at)
        .Str("description", Words(rng, 0, 12))
        .Str("displayName", Words(rng, 1, 2));
  } else if (collection == "app.bsky.feed.post") {
    o.Str("createdAt", created_at);
    if (rng.Below(6) == 0) {
      std::string image;
      Obj(&image).Str("alt", Words(rng, 0, 4)).Raw("image", BlobJson(rng, "image/jpeg")).End();
      std::string embed;
      Obj(&embed).Str("$type", "app.bsky.embed.images").Raw("images", "[" + image + "]").End();
      o.Raw("embed", embed);
    }
    o.Raw("langs", "[\"en\"]").Str("text", Words(rng, 1, 30));
  } else {
    Bytes data(1 + rng.Below(40));
    for (uint8_t& b : data) b = static_cast<uint8_t>(rng.Next());
    std::string bytes;
    Obj(&bytes).Str("$bytes", Base64Encode(data, Base64Alphabet::kStandard, false)).End();
    o.Str("createdAt", created_at).Raw("data", bytes).Str("text", Words(rng, 1, 10));
  }
  o.End();
  return out;
}

Result<atproto::Cid> JetstreamLog::RecordCid(uint64_t seq) const {
  ATFILL_ASSIGN_OR_RETURN(std::string record, Record(seq));
  return atproto::CidOfRecord(record);
}

namespace {

std::string_view OperationOf(JetstreamKind kind) {
  return kind == JetstreamKind::kCreate || kind == JetstreamKind::kCreateResync ? "create"
         : kind == JetstreamKind::kUpdate                                       ? "update"
                                                                                : "delete";
}

}  // namespace

Result<std::string> JetstreamLog::FrameV1(uint64_t seq) const {
  if (seq == 0 || seq > size()) {
    return Status::OutOfRange("jetstream seq " + std::to_string(seq) + " is not in the log");
  }
  const JetstreamEvent& e = events_[seq];
  if (e.kind == JetstreamKind::kSync) return std::string();  // v1 does not carry #sync
  const std::string& did = Did(seq);
  std::string out;
  Obj o(&out);
  o.Str("did", did)
      .Num("time_us", TimeUs(seq))
      .Num("cursor", static_cast<int64_t>(seq + options_.seq_offset));
  const std::string upstream_time = MillisTime(TimeUs(seq) - 20'000);
  const int64_t upstream_seq = kRelaySeqBase + static_cast<int64_t>(seq);
  if (IsCommit(seq)) {
    std::string commit;
    Obj c(&commit);
    c.Str("rev", Rev(seq))
        .Str("operation", OperationOf(e.kind))
        .Str("collection", Collection(seq))
        .Str("rkey", Rkey(seq));
    if (e.kind != JetstreamKind::kDelete) {
      ATFILL_ASSIGN_OR_RETURN(std::string record, Record(seq));
      ATFILL_ASSIGN_OR_RETURN(atproto::Cid cid, atproto::CidOfRecord(record));
      c.Raw("record", record).Str("cid", cid.ToString());
    }
    c.End();
    o.Str("kind", "commit").Raw("commit", commit);
  } else if (e.kind == JetstreamKind::kIdentity) {
    std::string identity;
    Obj(&identity)
        .Str("did", did)
        .Str("handle", Handle(seq))
        .Num("seq", upstream_seq)
        .Str("time", upstream_time)
        .End();
    o.Str("kind", "identity").Raw("identity", identity);
  } else {
    std::string account;
    Obj a(&account);
    a.Bool("active", e.status == AccountStatus::kActive).Str("did", did).Num("seq", upstream_seq);
    if (e.status != AccountStatus::kActive) a.Str("status", AccountStatusName(e.status));
    a.Str("time", upstream_time).End();
    o.Str("kind", "account").Raw("account", account);
  }
  o.End();
  return out;
}

Result<std::string> JetstreamLog::FrameV2(uint64_t seq) const {
  if (seq == 0 || seq > size()) {
    return Status::OutOfRange("jetstream seq " + std::to_string(seq) + " is not in the log");
  }
  const JetstreamEvent& e = events_[seq];
  const std::string& did = Did(seq);
  const std::string time = MicrosTime(TimeUs(seq));
  const std::string upstream_time = MillisTime(TimeUs(seq) - 20'000);
  const int64_t upstream_seq = kRelaySeqBase + static_cast<int64_t>(seq);
  std::string payload;
  Obj p(&payload);
  if (IsCommit(seq)) {
    p.Str("$type", std::string(kPayloadType) + "commit");
    std::string record;
    if (e.kind != JetstreamKind::kDelete) {
      ATFILL_ASSIGN_OR_RETURN(record, Record(seq));
      ATFILL_ASSIGN_OR_RETURN(atproto::Cid cid, atproto::CidOfRecord(record));
      p.Str("cid", cid.ToString());
    }
    p.Str("collection", Collection(seq)).Str("did", did).Str("operation", OperationOf(e.kind));
    if (!record.empty()) p.Raw("record", record);
    p.Str("rev", Rev(seq)).Str("rkey", Rkey(seq));
  } else if (e.kind == JetstreamKind::kIdentity) {
    std::string identity;
    Obj(&identity)
        .Str("did", did)
        .Str("handle", Handle(seq))
        .Num("seq", upstream_seq)
        .Str("time", upstream_time)
        .End();
    p.Str("$type", std::string(kPayloadType) + "identity")
        .Str("did", did)
        .Raw("identity", identity);
  } else if (e.kind == JetstreamKind::kSync) {
    std::string sync;
    Obj(&sync)
        .Raw("blocks", R"({"$bytes":""})")
        .Str("did", did)
        .Str("rev", Rev(seq))
        .Num("seq", upstream_seq)
        .Str("time", upstream_time)
        .End();
    p.Str("$type", std::string(kPayloadType) + "sync")
        .Str("did", did)
        .Num("seq", static_cast<int64_t>(seq + options_.seq_offset))
        .Raw("sync", sync)
        .Str("time", time)
        .End();
    std::string out;
    Obj(&out).Str("$type", "message").Raw("payload", payload).End();
    return out;
  } else {
    std::string account;
    Obj a(&account);
    a.Bool("active", e.status == AccountStatus::kActive).Str("did", did).Num("seq", upstream_seq);
    if (e.status != AccountStatus::kActive) a.Str("status", AccountStatusName(e.status));
    a.Str("time", upstream_time).End();
    p.Str("$type", std::string(kPayloadType) + "account").Raw("account", account).Str("did", did);
  }
  p.Num("seq", static_cast<int64_t>(seq + options_.seq_offset)).Str("time", time).End();
  std::string out;
  Obj(&out).Str("$type", "message").Raw("payload", payload).End();
  return out;
}

AccountStatus JetstreamLog::StatusAt(uint32_t account, uint64_t through_seq) const {
  const std::vector<uint64_t>& changes = status_changes_.at(account);
  auto it = std::upper_bound(changes.begin(), changes.end(), through_seq);
  if (it == changes.begin()) return net_->accounts()[account].status;
  return events_[*std::prev(it)].status;
}

Result<JetstreamTruth> JetstreamLog::Truth(uint64_t through_seq) const {
  JetstreamTruth truth;
  truth.through_seq = std::min(through_seq, size());
  std::map<std::string, std::pair<std::string, std::string>> live;  // uri -> (cid, body)
  std::map<std::string, JetstreamTruthAccount> accounts;
  for (uint64_t seq = 1; seq <= truth.through_seq; ++seq) {
    const JetstreamEvent& e = events_[seq];
    switch (e.kind) {
      case JetstreamKind::kSync: {
        // The repo's records are replaced by the resync rows that follow.
        const std::string prefix = "at://" + Did(seq) + "/";
        auto it = live.lower_bound(prefix);
        while (it != live.end() && it->first.starts_with(prefix)) it = live.erase(it);
        break;
      }
      case JetstreamKind::kCreate:
      case JetstreamKind::kCreateResync:
      case JetstreamKind::kUpdate: {
        ATFILL_ASSIGN_OR_RETURN(std::string body, Record(seq));
        ATFILL_ASSIGN_OR_RETURN(atproto::Cid cid, atproto::CidOfRecord(body));
        live[Uri(seq)] = {cid.ToString(), std::move(body)};
        break;
      }
      case JetstreamKind::kDelete:
        live.erase(Uri(seq));
        break;
      case JetstreamKind::kIdentity:
        break;
      case JetstreamKind::kAccount: {
        if (e.false_report) break;  // the PDS still has the account, and its records
        const std::string& did = Did(seq);
        accounts[did] = JetstreamTruthAccount{did, e.status, seq};
        if (e.status == AccountStatus::kTakendown || e.status == AccountStatus::kDeleted) {
          const std::string prefix = "at://" + did + "/";
          auto it = live.lower_bound(prefix);
          while (it != live.end() && it->first.starts_with(prefix)) it = live.erase(it);
        }
        break;
      }
    }
  }
  truth.records.reserve(live.size());
  for (auto& [uri, value] : live) {
    truth.records.push_back({uri, std::move(value.first), std::move(value.second)});
  }
  for (auto& [did, account] : accounts) truth.accounts.push_back(std::move(account));
  return truth;
}

std::string JetstreamTruth::ToTsv() const {
  std::string out;
  for (const JetstreamTruthRecord& r : records) {
    out.append(r.uri).push_back('\t');
    out.append(r.cid).push_back('\n');
  }
  return out;
}

uint64_t JetstreamLog::PublishedAt(std::chrono::nanoseconds elapsed) const {
  const uint64_t n = size();
  const uint64_t later = n - published_at_start_;
  if (later == 0 || elapsed.count() < 0) return published_at_start_;
  // Slot s is published at s / rate seconds.
  const double slots =
      std::floor(static_cast<double>(elapsed.count()) * options_.events_per_second / 1e9);
  if (slots >= static_cast<double>(later)) return n;
  const auto s = static_cast<uint64_t>(slots);
  uint64_t count = s + 1;
  if (options_.burst_every > 0) {
    const uint64_t e = options_.burst_every;
    const uint64_t cycle = e + options_.burst_size;
    const uint64_t c = s / (e + 1), r = s % (e + 1);
    // Cycles past 2^64 events are beyond any log.
    if (c > later / cycle) return n;
    count = c * cycle + (r < e ? r + 1 : cycle);
  }
  return published_at_start_ + std::min(count, later);
}

std::chrono::nanoseconds JetstreamLog::PublishTime(uint64_t seq) const {
  if (seq <= published_at_start_) return std::chrono::nanoseconds(0);
  const uint64_t j = seq - published_at_start_ - 1;
  uint64_t slot = j;
  if (options_.burst_every > 0) {
    const uint64_t e = options_.burst_every;
    const uint64_t cycle = e + options_.burst_size;
    slot = j / cycle * (e + 1) + std::min(j % cycle, e);
  }
  // Rounded up (and one more ns) so that PublishedAt(PublishTime(seq)) includes seq.
  const double ns = std::ceil(static_cast<double>(slot) * 1e9 / options_.events_per_second);
  return std::chrono::nanoseconds(static_cast<int64_t>(ns) + 1);
}

Result<Bytes> TrainJetstreamDictionary(const JetstreamLog& log, int version, uint32_t id,
                                       uint64_t samples, size_t capacity) {
  std::string all;
  std::vector<size_t> sizes;
  const uint64_t count = std::min(samples, log.size());
  for (uint64_t seq = 1; seq <= count; ++seq) {
    ATFILL_ASSIGN_OR_RETURN(std::string frame, version == 1 ? log.FrameV1(seq) : log.FrameV2(seq));
    all += frame;
    sizes.push_back(frame.size());
  }
  const std::string what = "training the jetstream v" + std::to_string(version) +
                           " dictionary on " + std::to_string(sizes.size()) + " frames (" +
                           std::to_string(all.size()) + " bytes)";
  Bytes trained(capacity);
  const size_t size = ZDICT_trainFromBuffer(trained.data(), trained.size(), all.data(),
                                            sizes.data(), static_cast<unsigned>(sizes.size()));
  if (ZDICT_isError(size)) return Status::Internal(what + ": " + ZDICT_getErrorName(size));
  const size_t header = ZDICT_getDictHeaderSize(trained.data(), size);
  if (ZDICT_isError(header)) return Status::Internal(what + ": " + ZDICT_getErrorName(header));
  // The trained content again, under our ID (the trainer derives one from the content).
  ZDICT_params_t params{};
  params.compressionLevel = version == 1 ? 3 : 1;
  params.dictID = id;
  Bytes dict(capacity);
  const size_t final_size = ZDICT_finalizeDictionary(
      dict.data(), dict.size(), trained.data() + header, size - header, all.data(), sizes.data(),
      static_cast<unsigned>(sizes.size()), params);
  if (ZDICT_isError(final_size)) {
    return Status::Internal(what + ": " + ZDICT_getErrorName(final_size));
  }
  dict.resize(final_size);
  if (ZDICT_getDictID(dict.data(), dict.size()) != id) {
    return Status::Internal(what + ": the dictionary does not carry ID " + std::to_string(id));
  }
  return dict;
}

}  // namespace atfill::simnet
