#include "sources/archive/replay.hpp"

#include "sources/archive/replay_impl.hpp"

#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <unordered_map>

#include <xxhash.h>

#include "atproto/cbor.hpp"
#include "atproto/cid.hpp"
#include "atproto/json.hpp"
#include "atproto/tid.hpp"
#include "atproto/value.hpp"
#include "pipeline/job.hpp"
#include "state/codec.hpp"

namespace atfill::sources {
namespace {

// How long the account sweep waits for the records sweep's commit between two ticks.
constexpr auto kCommitWait = std::chrono::milliseconds(100);

using pipeline::AccountEvent;
using pipeline::Event;
using pipeline::EventChunk;
using pipeline::EventError;
using pipeline::RecordEvent;

bool CommitShaped(jss::Kind k) {
  return k == jss::Kind::kCreate || k == jss::Kind::kUpdate || k == jss::Kind::kDelete ||
         k == jss::Kind::kCreateResync;
}

std::string BlockId(std::string_view segment, uint32_t block) {
  return std::string(segment) + "/" + std::to_string(block);
}

std::string Be64(uint64_t v) {
  std::string out;
  state::codec::AppendBe64(&out, v);
  return out;
}

uint64_t FromBe64(std::string_view s) {
  uint64_t v = 0;
  for (size_t i = 0; i < 8 && i < s.size(); ++i) v = (v << 8) | static_cast<uint8_t>(s[i]);
  return v;
}

// The chunk of a records-sweep block: what Decode needs, then the frame.
struct BlockHeader {
  uint32_t uncompressed_size = 0;
  uint64_t after_seq = 0;
  uint64_t before_seq = 0;
  uint32_t block = 0;
  std::string_view segment;
  std::string_view frame;
};

template <typename T>
void PutRaw(std::string* out, T v) {
  out->append(reinterpret_cast<const char*>(&v), sizeof(v));
}
template <typename T>
bool GetRaw(std::string_view* in, T* v) {
  if (in->size() < sizeof(T)) return false;
  std::memcpy(v, in->data(), sizeof(T));
  in->remove_prefix(sizeof(T));
  return true;
}

void EncodeBlockChunk(std::string* raw, const PlannedBlock& b, uint64_t after, uint64_t before,
                      const std::string& segment, const std::string& frame) {
  raw->clear();
  raw->reserve(frame.size() + segment.size() + 32);
  PutRaw(raw, b.uncompressed_size);
  PutRaw(raw, after);
  PutRaw(raw, before);
  PutRaw(raw, b.index);
  PutRaw(raw, static_cast<uint16_t>(segment.size()));
  raw->append(segment);
  raw->append(frame);
}

bool DecodeBlockChunk(std::string_view raw, BlockHeader* h) {
  uint16_t name_len = 0;
  if (!GetRaw(&raw, &h->uncompressed_size) || !GetRaw(&raw, &h->after_seq) ||
      !GetRaw(&raw, &h->before_seq) || !GetRaw(&raw, &h->block) || !GetRaw(&raw, &name_len) ||
      raw.size() < name_len) {
    return false;
  }
  h->segment = raw.substr(0, name_len);
  h->frame = raw.substr(name_len);
  return true;
}

// A commit row as a RecordEvent; false with *error set when the row cannot be one.
bool RecordOfRow(const jss::Row& row, RecordEvent* r, EventError* error) {
  r->did.assign(row.did);
  r->collection.assign(row.collection);
  r->rkey.assign(row.rkey);
  r->rev.assign(row.rev);
  r->origin = pipeline::Origin::kReplay;
  r->position = row.seq;
  switch (row.kind) {
    case jss::Kind::kUpdate:
      r->operation = pipeline::Operation::kUpdate;
      break;
    case jss::Kind::kDelete:
      r->operation = pipeline::Operation::kDelete;
      return true;
    default:
      r->operation = pipeline::Operation::kCreate;
      break;
  }
  r->cid = atproto::Cid::Compute(atproto::Cid::Codec::kDagCbor, row.payload);
  if (Status st = atproto::CborRecordToJson(row.payload, &r->body, &r->created_at); !st.ok()) {
    *error = {"bad_record", r->Uri(), "seq " + std::to_string(row.seq) + ": " + st.message()};
    return false;
  }
  return true;
}

// An account or sync marker as an AccountEvent; false with *error set when it is unreadable.
bool AccountOfRow(const jss::Row& row, const std::vector<std::string>& collections, AccountEvent* a,
                  EventError* error) {
  a->did.assign(row.did);
  a->origin = pipeline::Origin::kReplay;
  a->position = row.seq;
  a->time_us = row.witnessed_at;
  if (row.kind == jss::Kind::kSync) {
    a->resync = true;
    a->resync_collections = collections;
    return true;
  }
  auto value = atproto::DecodeCbor(row.payload);
  const atproto::Value* active = value.ok() ? value->Find("active") : nullptr;
  if (active == nullptr || active->kind() != atproto::Value::Kind::kBool) {
    *error = {"bad_account_event", a->did,
              "seq " + std::to_string(row.seq) +
                  ": the #account marker is not a DAG-CBOR map with a boolean 'active'" +
                  (value.ok() ? std::string() : ": " + value.status().message())};
    return false;
  }
  a->active = active->as_bool();
  a->status = pipeline::AccountStatus::kActive;
  if (const atproto::Value* status = value->Find("status");
      status != nullptr && status->kind() == atproto::Value::Kind::kString) {
    a->status = pipeline::ParseAccountStatus(status->as_string());
  } else if (!a->active) {
    a->status = pipeline::AccountStatus::kOther;
  }
  if (const atproto::Value* seq = value->Find("seq");
      seq != nullptr && seq->kind() == atproto::Value::Kind::kInt) {
    a->seq = seq->as_int();
  }
  return true;
}

bool IsKill(const AccountEvent& a) {
  return a.resync || (!a.active && pipeline::StatusPurgesRecords(a.status));
}

}  // namespace

std::string ReplayDidKey(uint64_t job, std::string_view did) {
  std::string key = state::codec::KeyWithId("rd", job);
  key.append(did);
  return key;
}

std::string ReplayRefoldKey(uint64_t job, std::string_view did) {
  std::string key = state::codec::KeyWithId("rf", job);
  key.append(did);
  return key;
}

Status ReplayOptions::Validate() const {
  if (marker_tail_hours < 0) return Status::Invalid("replay_marker_tail_hours must be 0 or more");
  if (max_block_bytes < 1024)
    return Status::Invalid("replay max_block_bytes must be at least 1024");
  if (max_failed_in_a_row < 1) return Status::Invalid("replay max_failed_in_a_row must be >= 1");
  if (prefetch_blocks < 1 || prefetch_blocks > 256) {
    return Status::Invalid("replay prefetch_blocks must be 1..256");
  }
  if (tick_ms < 1 || tick_ms > 10'000) return Status::Invalid("replay tick_ms must be 1..10000");
  for (const std::string& c : collections) {
    if (c.empty()) return Status::Invalid("replay: an empty collection name");
  }
  return Status::OK();
}

ReplaySource::Impl::Impl(Archive* archive, ReplayOptions options, uint64_t job, state::KvStore* kv)
    : archive_(archive),
      options_(std::move(options)),
      job_(job),
      kv_(kv),
      failed_(*kv),
      io_(std::make_shared<Io>()),
      only_blocks_(options_.only_blocks.begin(), options_.only_blocks.end()) {}

std::string ReplaySource::Impl::Describe() const { return "replay of " + archive_->Describe(); }

ReplayStats ReplaySource::Impl::stats() const {
  std::lock_guard lock(stats_mu_);
  return stats_;
}

void ReplaySource::Impl::Committed(uint64_t through_seq) {
  // Under the lock, so a waiting Read cannot miss the notification between its check and its wait.
  std::lock_guard lock(commit_mu_);
  committed_.store(through_seq, std::memory_order_release);
  any_committed_.store(true, std::memory_order_release);
  commit_cv_.notify_all();
}

std::string ReplaySource::Impl::CursorText(uint64_t seq) const {
  if (sweep_ == Sweep::kRecords) {
    return "records " + std::to_string(tip_) + " " + std::to_string(seq);
  }
  return "accounts " + std::to_string(tip_) + " " + std::to_string(account_start_) + " " +
         std::to_string(seq);
}

Status ReplaySource::Impl::Seek(const std::string& resume_cursor) {
  // The blocks this job recorded as failed: one read now leaves the list.
  ATFILL_RETURN_IF_ERROR(failed_.Scan(job_, [this](const state::FailedBlock& b) {
    failed_ids_.insert(b.block_id);
    return true;
  }));
  if (resume_cursor.empty()) {
    done_seq_ = asked_seq_ = options_.after_seq;
    tip_ = options_.before_seq;
    announce_tip_ = tip_ != 0;
    return Status::OK();
  }
  char kind[16] = {};
  unsigned long long a = 0, b = 0, c = 0;
  const int n = std::sscanf(resume_cursor.c_str(), "%15s %llu %llu %llu", kind, &a, &b, &c);
  const std::string k = kind;
  if (k == "records" && n == 3) {
    tip_ = a;
    done_seq_ = b;
  } else if (k == "accounts" && n == 4) {
    sweep_ = Sweep::kAccounts;
    tip_ = a;
    account_start_ = b;
    done_seq_ = c;
  } else {
    return Status::Invalid("replay cursor '" + resume_cursor +
                           "' is not 'records TIP SEQ' or 'accounts TIP START SEQ'");
  }
  asked_seq_ = done_seq_;
  return Status::OK();
}

struct ReplaySource::Impl::Io {
  std::mutex mu;
  std::condition_variable cv;
};

struct ReplaySource::Impl::Fetch {
  SegmentInfo segment;
  PlannedBlock block;
  std::string id;
  uint64_t after = 0;    // the sweep's rows at or below it were asked for before this block
  uint64_t through = 0;  // the sweep's rows at or below it are in this block or earlier ones
  std::optional<Result<std::string>> frame;  // under Io::mu until it is there
};

struct ReplaySource::Impl::Refold {
  std::string did;
  uint64_t after_seq = 0;  // the kill's seq
  uint64_t through = 0;    // the pages read so far cover (after_seq, through]
  std::shared_ptr<std::optional<Result<Plan>>> plan;  // the page asked for
  bool page = false;                                  // a page's blocks are being read
  uint64_t page_through = 0;
  std::vector<std::pair<SegmentInfo, PlannedBlock>> blocks;  // the page's blocks
  size_t next = 0;                                           // the first not asked for
  std::deque<std::shared_ptr<Fetch>> window;
};

struct ReplaySource::Impl::Marking {
  std::shared_ptr<Fetch> fetch;
  jss::Block block;
  size_t row = 0;  // the next row to apply
  uint64_t frame_bytes = 0;
};

bool ReplaySource::Impl::Tick(EventChunk* chunk) {
  chunk->tick = true;
  return true;
}

bool ReplaySource::Impl::Await(const std::function<bool()>& ready) {
  std::unique_lock lock(io_->mu);
  return io_->cv.wait_for(lock, std::chrono::milliseconds(options_.tick_ms), ready);
}

bool ReplaySource::Impl::Arrived(const Fetch& fetch) const {
  std::lock_guard lock(io_->mu);
  return fetch.frame.has_value();
}

std::shared_ptr<ReplaySource::Impl::Fetch> ReplaySource::Impl::Ask(const SegmentInfo& segment,
                                                                   const PlannedBlock& block,
                                                                   uint64_t after,
                                                                   uint64_t through) {
  auto fetch = std::make_shared<Fetch>();
  fetch->segment = segment;
  fetch->block = block;
  fetch->id = BlockId(segment.name, block.index);
  fetch->after = after;
  fetch->through = through;
  // The callback may outlive the source: it holds what it writes.
  archive_->StartGetBlock(segment, block.index, [io = io_, fetch](Result<std::string> frame) {
    {
      std::lock_guard lock(io->mu);
      fetch->frame.emplace(std::move(frame));
    }
    io->cv.notify_all();
  });
  return fetch;
}

void ReplaySource::Impl::StartPlan(Refold* refold) {
  PlanRequest request;
  auto slot = std::make_shared<std::optional<Result<Plan>>>();
  if (refold != nullptr) {
    request.collections = options_.collections;
    request.dids = {refold->did};
    request.after_seq = refold->through;
    refold->plan = slot;
  } else {
    if (sweep_ == Sweep::kRecords) {
      request.collections = options_.collections;
      request.markers = false;
    } else {
      request.commits = false;
    }
    request.after_seq = planned_ ? plan_.planned_through : asked_seq_;
    plan_pending_ = slot;
  }
  request.before_seq = tip_;
  archive_->StartPlanSnapshot(request, [io = io_, slot](Result<Plan> plan) {
    {
      std::lock_guard lock(io->mu);
      slot->emplace(std::move(plan));
    }
    io->cv.notify_all();
  });
}

Status ReplaySource::Impl::TakePlan(Plan plan) {
  if (planned_ && plan.planned_through <= plan_.planned_through && plan.planned_through < tip_) {
    return Status::Unavailable("the archive's plan did not advance past seq " +
                               std::to_string(plan_.planned_through));
  }
  if (tip_ == 0) {
    tip_ = plan.sealed_tip;
    announce_tip_ = tip_ != 0;
  }
  plan_ = std::move(plan);
  planned_ = true;
  plan_segment_ = 0;
  plan_block_ = 0;
  return Status::OK();
}

Status ReplaySource::Impl::Fill() {
  if (!fill_error_.ok()) return fill_error_;
  Status st = FillWindow();
  if (!st.ok()) fill_error_ = st;
  return st;
}

Status ReplaySource::Impl::FillWindow() {
  // While blocks fail in a row, one at a time: a failing archive is not asked for more than the
  // streak that stops the job, and each failure's retries are not multiplied by the window.
  const size_t limit = failed_in_a_row_ > 0 ? 1 : options_.prefetch_blocks;
  while (window_.size() < limit && !ended_) {
    if (plan_pending_ != nullptr) {
      std::optional<Result<Plan>> got;
      {
        std::lock_guard lock(io_->mu);
        if (!plan_pending_->has_value()) return Status::OK();  // on its way
        got = std::move(*plan_pending_);
      }
      plan_pending_.reset();
      if (!got->ok()) return got->status();
      ATFILL_RETURN_IF_ERROR(TakePlan(std::move(**got)));
      continue;
    }
    if (!planned_) {
      StartPlan(nullptr);
      continue;
    }
    if (tip_ == 0 || asked_seq_ >= tip_) {  // an empty archive, or the sweep's end
      ended_ = true;
      break;
    }
    if (plan_segment_ >= plan_.segments.size()) {
      if (plan_.planned_through >= tip_) {
        ended_ = true;
        break;
      }
      StartPlan(nullptr);
      continue;
    }
    const PlannedSegment& seg = plan_.segments[plan_segment_];
    if (plan_block_ >= seg.blocks.size()) {
      ++plan_segment_;
      plan_block_ = 0;
      continue;
    }
    const PlannedBlock& b = seg.blocks[plan_block_++];
    if (b.max_seq <= asked_seq_) continue;
    if (sweep_ == Sweep::kRecords && !only_blocks_.empty() &&
        !only_blocks_.count(BlockId(seg.segment.name, b.index))) {
      continue;
    }
    const uint64_t through = std::min(b.max_seq, tip_);
    window_.push_back(Ask(seg.segment, b, asked_seq_, through));
    asked_seq_ = through;
  }
  return Status::OK();
}

void ReplaySource::Impl::ClearFailure(EventChunk* chunk, const std::string& block_id) const {
  {
    std::lock_guard lock(stats_mu_);
    if (failed_ids_.erase(block_id) == 0) return;
    if (stats_.failed_blocks > 0) --stats_.failed_blocks;
  }
  failed_.Remove(&chunk->state_writes, job_, block_id);
  chunk->counters.emplace_back("failed_blocks", -1);
}

bool ReplaySource::Impl::KnownFailed(const std::string& block_id) const {
  std::lock_guard lock(stats_mu_);
  return failed_ids_.count(block_id) != 0;
}

void ReplaySource::Impl::RecordFailure(EventChunk* chunk, const std::string& block_id,
                                       const std::string& kind, const std::string& message) const {
  {
    // A block is recorded once (a refold may meet it again).
    std::lock_guard lock(stats_mu_);
    if (!failed_ids_.insert(block_id).second) return;
  }
  state::FailedBlock fb;
  fb.block_id = block_id;
  fb.reason = kind + ": " + message;
  fb.attempts = 1;
  fb.last_failed_us = std::chrono::duration_cast<std::chrono::microseconds>(
                          std::chrono::system_clock::now().time_since_epoch())
                          .count();
  if (Status s = failed_.Put(&chunk->state_writes, job_, fb); !s.ok()) {
    chunk->errors.push_back({"failed_block_unrecorded", block_id, s.message()});
  }
  chunk->errors.push_back({kind, block_id, message});
  chunk->counters.emplace_back("failed_blocks", 1);
  std::lock_guard lock(stats_mu_);
  ++stats_.failed_blocks;
}

Result<bool> ReplaySource::Impl::Read(EventChunk* chunk) {
  while (true) {
    switch (sweep_) {
      case Sweep::kRecords: {
        auto more = ReadRecords(chunk);
        if (!more.ok() || *more) {
          if (more.ok()) ++chunks_out_;
          return more;
        }
        if (!options_.accounts) {
          sweep_ = Sweep::kDone;
          return false;
        }
        sweep_ = Sweep::kAccounts;
        planned_ = false;
        ended_ = false;
        account_start_ = 0;
        done_seq_ = UINT64_MAX;  // set by StartAccounts
        continue;
      }
      case Sweep::kAccounts: {
        auto more = ReadAccounts(chunk);
        if (more.ok() && *more) ++chunks_out_;
        if (more.ok() && !*more) sweep_ = Sweep::kDone;
        return more;
      }
      case Sweep::kDone:
        return false;
    }
  }
}

Result<ReplaySource::Impl::Next> ReplaySource::Impl::TakeNext(std::shared_ptr<Fetch>* fetch,
                                                              Result<std::string>* frame) {
  while (true) {
    ATFILL_RETURN_IF_ERROR(Fill());
    if (window_.empty()) {
      if (ended_) return Next::kEnd;
      // The next plan page is on its way.
      if (!Await([&] { return plan_pending_ != nullptr && plan_pending_->has_value(); })) {
        return Next::kWait;
      }
      continue;
    }
    const std::shared_ptr<Fetch> f = window_.front();
    if (!Await([&] { return f->frame.has_value(); })) return Next::kWait;
    window_.pop_front();
    // Arrived (seen under the lock): the archive's callback is done with it.
    *frame = std::move(*f->frame);
    failed_in_a_row_ = frame->ok() ? 0 : failed_in_a_row_ + 1;
    if (failed_in_a_row_ < options_.max_failed_in_a_row) {
      // The next request starts now, not at the next Read; an error stays for the next Fill.
      static_cast<void>(Fill());
    }
    *fetch = f;
    return Next::kBlock;
  }
}

Result<bool> ReplaySource::Impl::ReadRecords(EventChunk* chunk) {
  std::shared_ptr<Fetch> f;
  Result<std::string> frame = std::string();
  ATFILL_ASSIGN_OR_RETURN(const Next next, TakeNext(&f, &frame));
  if (next == Next::kEnd) return false;
  if (next == Next::kWait) return Tick(chunk);
  const PlannedBlock& b = f->block;
  const std::string& id = f->id;
  const uint64_t through = f->through;
  chunk->stage =
      only_blocks_.empty() ? state::JobStage::kReplaying : state::JobStage::kRetryingBlocks;
  chunk->raw_first_position = b.min_seq;
  chunk->input_done = through;
  chunk->resume_cursor = CursorText(through);
  if (announce_tip_) {
    // The job's progress: seq N of the pinned tip.
    chunk->counters.emplace_back(pipeline::kInputTotal, static_cast<int64_t>(tip_));
    announce_tip_ = false;
  }
  if (!frame.ok()) {
    RecordFailure(chunk, id, "archive_block", frame.status().message());
    // The cursor does not pass an undelivered block until a later one is delivered: a job the
    // streak stops reads the whole streak again when it resumes.
    chunk->resume_cursor.clear();
    chunk->input_done = 0;
    done_seq_ = through;
    if (failed_in_a_row_ >= options_.max_failed_in_a_row) {
      return Status::Unavailable("the archive failed " + std::to_string(failed_in_a_row_) +
                                 " blocks in a row; stopping (resume to continue)");
    }
    return true;
  }
  chunk->bytes_read = frame->size();
  chunk->units_read = 1;
  EncodeBlockChunk(&chunk->raw, b, f->after, tip_, f->segment.name, *frame);
  done_seq_ = through;
  last_records_chunk_ = chunks_out_;
  return true;
}

void ReplaySource::Impl::Decode(EventChunk* chunk) const {
  if (chunk->raw.empty()) return;
  BlockHeader h;
  if (!DecodeBlockChunk(chunk->raw, &h)) {
    chunk->errors.push_back({"internal", "replay chunk", "a replay chunk is malformed"});
    return;
  }
  const std::string id = BlockId(h.segment, h.block);
  auto body =
      jss::DecompressFrame({reinterpret_cast<const uint8_t*>(h.frame.data()), h.frame.size()},
                           h.uncompressed_size, options_.max_block_bytes);
  if (!body.ok()) return RecordFailure(chunk, id, "bad_block", body.status().message());
  auto block = jss::Block::Parse(std::move(*body));
  if (!block.ok()) return RecordFailure(chunk, id, "bad_block", block.status().message());
  std::unordered_map<std::string_view, uint64_t> first_seq;
  uint64_t rows = 0;
  chunk->events.reserve(chunk->events.size() + block->size());
  for (size_t i = 0; i < block->size(); ++i) {
    const jss::Row row = block->row(i);
    if (row.seq <= h.after_seq || row.seq > h.before_seq) continue;
    if (!CommitShaped(row.kind)) continue;
    if (!options_.shard.Owns(row.did)) continue;
    if (!pipeline::CollectionMatches(row.collection, options_.collections)) continue;
    ++rows;
    RecordEvent r;
    EventError error;
    if (!RecordOfRow(row, &r, &error)) {
      chunk->errors.push_back(std::move(error));
      ++chunk->dropped;
      continue;
    }
    chunk->events.emplace_back(std::move(r));
    first_seq.emplace(row.did, row.seq);
  }
  // The accounts that hold records, for the account sweep: each written once per run (a set of
  // their hashes remembers which were; past its cap every chunk writes its accounts).
  for (const auto& [did, seq] : first_seq) {
    const uint64_t hash = XXH3_64bits(did.data(), did.size());
    {
      std::lock_guard lock(seen_mu_);
      if (seen_dids_.count(hash)) continue;
      if (seen_dids_.size() < kSeenDidsCap) seen_dids_.insert(hash);
    }
    chunk->state_writes.Put(state::Family::kQueue, ReplayDidKey(job_, did), Be64(seq));
  }
  if (options_.retry_of != 0) failed_.Remove(&chunk->state_writes, options_.retry_of, id);
  ClearFailure(chunk, id);
  std::lock_guard lock(stats_mu_);
  ++stats_.blocks;
  stats_.rows += rows;
  stats_.bytes += h.frame.size();
}

bool ReplaySource::Impl::StartAccounts() {
  account_start_ = 0;
  if (options_.after_seq > 0) {
    // A window: its markers.
    account_start_ = options_.after_seq + 1;
    std::fprintf(stderr,
                 "atfill: replay job %" PRIu64 ": the account sweep covers seqs %" PRIu64
                 "..%" PRIu64 "\n",
                 job_, account_start_, tip_);
  } else if (options_.marker_tail_hours > 0) {
    if (list_pending_ == nullptr) {
      auto slot = std::make_shared<std::optional<Result<std::vector<SegmentInfo>>>>();
      list_pending_ = slot;
      archive_->StartListSegments([io = io_, slot](Result<std::vector<SegmentInfo>> segments) {
        {
          std::lock_guard lock(io->mu);
          slot->emplace(std::move(segments));
        }
        io->cv.notify_all();
      });
    }
    std::optional<Result<std::vector<SegmentInfo>>> segments;
    {
      std::lock_guard lock(io_->mu);
      if (!list_pending_->has_value()) return false;
      segments = std::move(*list_pending_);
    }
    list_pending_.reset();
    if (!segments->ok()) {
      std::fprintf(stderr,
                   "atfill: replay job %" PRIu64
                   ": segments cannot be listed (%s); the account sweep reads the whole archive\n",
                   job_, segments->status().message().c_str());
    } else if (!(*segments)->empty()) {
      const int64_t newest = (*segments)->back().max_witnessed_at;
      const int64_t from = newest - static_cast<int64_t>(options_.marker_tail_hours * 3600e6);
      for (const SegmentInfo& s : **segments) {
        if (s.max_witnessed_at >= from) {
          account_start_ = s.min_seq;
          std::fprintf(stderr,
                       "atfill: replay job %" PRIu64 ": the account sweep starts at seq %" PRIu64
                       " (segment %s, the first within %g h of the newest)\n",
                       job_, account_start_, s.name.c_str(), options_.marker_tail_hours);
          break;
        }
      }
    }
  }
  if (account_start_ == 0 && options_.after_seq == 0) {
    std::fprintf(stderr,
                 "atfill: replay job %" PRIu64 ": the account sweep reads the whole archive\n",
                 job_);
  }
  done_seq_ = account_start_ > 0 ? account_start_ - 1 : 0;
  asked_seq_ = done_seq_;
  return true;
}

Result<bool> ReplaySource::Impl::StepRefold() {
  Refold& r = *refold_;
  EventChunk* chunk = &building_;
  while (true) {
    if (!r.page) {
      if (r.through >= tip_) break;
      if (r.plan == nullptr) StartPlan(&r);
      std::optional<Result<Plan>> got;
      {
        std::lock_guard lock(io_->mu);
        if (!r.plan->has_value()) return false;
        got = std::move(*r.plan);
      }
      r.plan.reset();
      if (!got->ok()) return got->status();
      r.blocks.clear();
      r.next = 0;
      for (const PlannedSegment& seg : (*got)->segments) {
        for (const PlannedBlock& b : seg.blocks) {
          if (!KnownFailed(BlockId(seg.segment.name, b.index)))
            r.blocks.emplace_back(seg.segment, b);
        }
      }
      r.page = true;
      r.page_through = (*got)->planned_through;
    }
    while (r.window.size() < options_.prefetch_blocks && r.next < r.blocks.size()) {
      const auto& [segment, block] = r.blocks[r.next++];
      r.window.push_back(Ask(segment, block, 0, 0));
    }
    if (r.window.empty()) {
      // The page is read.
      if (r.page_through <= r.through) break;
      r.through = r.page_through;
      r.page = false;
      continue;
    }
    const std::shared_ptr<Fetch> f = r.window.front();
    if (!Arrived(*f)) return false;
    r.window.pop_front();
    Result<std::string> frame = std::move(*f->frame);
    const PlannedBlock& b = f->block;
    if (!frame.ok()) {
      RecordFailure(chunk, f->id, "archive_block", frame.status().message());
      continue;
    }
    auto body =
        jss::DecompressFrame({reinterpret_cast<const uint8_t*>(frame->data()), frame->size()},
                             b.uncompressed_size, options_.max_block_bytes);
    if (!body.ok()) {
      RecordFailure(chunk, f->id, "bad_block", body.status().message());
      continue;
    }
    auto block = jss::Block::Parse(std::move(*body));
    if (!block.ok()) {
      RecordFailure(chunk, f->id, "bad_block", block.status().message());
      continue;
    }
    for (size_t i = 0; i < block->size(); ++i) {
      const jss::Row row = block->row(i);
      if (row.did != r.did || row.seq <= r.after_seq || row.seq > tip_) continue;
      EventError error;
      if (CommitShaped(row.kind)) {
        if (!pipeline::CollectionMatches(row.collection, options_.collections)) continue;
        RecordEvent e;
        if (RecordOfRow(row, &e, &error)) {
          chunk->events.emplace_back(std::move(e));
        } else {
          chunk->errors.push_back(std::move(error));
          ++chunk->dropped;
        }
      } else if (row.kind == jss::Kind::kAccount || row.kind == jss::Kind::kSync) {
        AccountEvent a;
        if (AccountOfRow(row, options_.collections, &a, &error)) {
          chunk->events.emplace_back(std::move(a));
        } else {
          chunk->errors.push_back(std::move(error));
        }
      }
    }
  }
  refolded_.insert(r.did);
  chunk->state_writes.Put(state::Family::kQueue, ReplayRefoldKey(job_, r.did), Be64(r.after_seq));
  chunk->counters.emplace_back("refolded_dids", 1);
  std::lock_guard lock(stats_mu_);
  ++stats_.refolded_dids;
  return true;
}

Result<bool> ReplaySource::Impl::ApplyMarkers() {
  Marking& m = *marking_;
  EventChunk* chunk = &building_;
  while (m.row < m.block.size()) {
    const jss::Row row = m.block.row(m.row++);
    if (row.seq <= m.fetch->after || row.seq > tip_) continue;
    if (row.kind != jss::Kind::kAccount && row.kind != jss::Kind::kSync) continue;
    if (!options_.shard.Owns(row.did)) continue;
    const std::string did(row.did);
    if (refolded_.count(did)) continue;
    ATFILL_ASSIGN_OR_RETURN(auto holds, kv_->Get(state::Family::kQueue, ReplayDidKey(job_, did)));
    if (!holds && options_.retry_of != 0) {
      // A retry also applies the markers the first job missed (they may have been in the
      // failed blocks) of the accounts that job wrote records for.
      ATFILL_ASSIGN_OR_RETURN(
          holds, kv_->Get(state::Family::kQueue, ReplayDidKey(options_.retry_of, did)));
    }
    if (!holds && !options_.all_markers) continue;  // it wrote no record in the collections
    ATFILL_ASSIGN_OR_RETURN(auto refolded,
                            kv_->Get(state::Family::kQueue, ReplayRefoldKey(job_, did)));
    if (refolded && FromBe64(*refolded) < row.seq) {
      refolded_.insert(did);
      continue;
    }
    AccountEvent a;
    EventError error;
    if (!AccountOfRow(row, options_.collections, &a, &error)) {
      chunk->errors.push_back(std::move(error));
      continue;
    }
    const bool kill = IsKill(a);
    if (kill && options_.before_seq != 0 && a.time_us > 0) {
      // A window (a live stream's gap) is replayed beside the stream, which may already have
      // written the account's later records: the marker removes only what the account held
      // at its time (a repo's revs grow with time; a relay refuses revs from the future).
      auto tid = atproto::Tid::FromParts(static_cast<uint64_t>(a.time_us), 0);
      if (tid.ok()) a.purge_before_rev = tid->str();
    }
    chunk->events.emplace_back(std::move(a));
    // The account's rows after the kill are replayed again (the blooms find its blocks), before
    // the rest of this block.
    if (kill) {
      refold_ = std::make_unique<Refold>();
      refold_->did = did;
      refold_->after_seq = row.seq;
      refold_->through = row.seq;
      return false;
    }
  }
  return true;
}

Result<bool> ReplaySource::Impl::ReadAccounts(EventChunk* chunk) {
  // The DIDs that hold records are read from state: wait until the records sweep is durable.
  // First a tick that seals the batch holding the sweep's last chunks (no waiting for the batch's
  // delay), then a wait that Committed() ends. The wait is bounded so that the engine, between
  // two reads, notices a stop or a failure that means the commit never comes.
  const auto durable = [&] {
    return !last_records_chunk_ ||
           (any_committed_.load(std::memory_order_acquire) &&
            committed_.load(std::memory_order_acquire) >= *last_records_chunk_);
  };
  if (!durable()) {
    chunk->tick = true;
    if (!seal_asked_) {
      seal_asked_ = true;
      chunk->seal = true;
      return true;
    }
    std::unique_lock lock(commit_mu_);
    if (!commit_cv_.wait_for(lock, kCommitWait, durable)) return true;
    chunk->tick = false;
  }
  if (done_seq_ == UINT64_MAX && !StartAccounts()) {
    // The listing is on its way.
    if (!Await([&] { return list_pending_->has_value(); }) || !StartAccounts()) {
      return Tick(chunk);
    }
  }
  // The block's chunk is handed out once its markers, and the refolds they start, are in.
  const auto hand_out = [&] {
    *chunk = std::move(building_);
    building_ = EventChunk{};
    return true;
  };
  while (true) {
    if (refold_ != nullptr) {
      ATFILL_ASSIGN_OR_RETURN(const bool complete, StepRefold());
      if (!complete) {
        const Refold& r = *refold_;
        if (!Await([&] {
              return (r.plan != nullptr && r.plan->has_value()) ||
                     (!r.window.empty() && r.window.front()->frame.has_value());
            })) {
          return Tick(chunk);
        }
        continue;
      }
      refold_.reset();
    }
    if (marking_ != nullptr) {
      ATFILL_ASSIGN_OR_RETURN(const bool applied, ApplyMarkers());
      if (!applied) continue;  // a kill: its refold first
      {
        std::lock_guard lock(stats_mu_);
        ++stats_.blocks;
        stats_.bytes += marking_->frame_bytes;
      }
      marking_.reset();
      return hand_out();
    }
    std::shared_ptr<Fetch> f;
    Result<std::string> frame = std::string();
    ATFILL_ASSIGN_OR_RETURN(const Next next, TakeNext(&f, &frame));
    if (next == Next::kEnd) return false;
    if (next == Next::kWait) return Tick(chunk);
    const PlannedBlock& b = f->block;
    const uint64_t through = f->through;
    building_ = EventChunk{};
    EventChunk* c = &building_;
    c->stage = state::JobStage::kReplayingAccounts;
    c->input_done = through;
    c->resume_cursor = CursorText(through);
    c->units_read = 1;
    done_seq_ = through;
    if (!frame.ok()) {
      RecordFailure(c, f->id, "archive_block", frame.status().message());
      c->resume_cursor.clear();
      c->input_done = 0;
      if (failed_in_a_row_ >= options_.max_failed_in_a_row) {
        return Status::Unavailable("the archive failed " + std::to_string(failed_in_a_row_) +
                                   " blocks in a row; stopping (resume to continue)");
      }
      return hand_out();
    }
    c->bytes_read = frame->size();
    ClearFailure(c, f->id);
    auto body =
        jss::DecompressFrame({reinterpret_cast<const uint8_t*>(frame->data()), frame->size()},
                             b.uncompressed_size, options_.max_block_bytes);
    if (!body.ok()) {
      RecordFailure(c, f->id, "bad_block", body.status().message());
      return hand_out();
    }
    auto block = jss::Block::Parse(std::move(*body));
    if (!block.ok()) {
      RecordFailure(c, f->id, "bad_block", block.status().message());
      return hand_out();
    }
    marking_ = std::make_unique<Marking>();
    marking_->fetch = f;
    marking_->block = std::move(*block);
    marking_->frame_bytes = frame->size();
  }
}

ReplaySource::ReplaySource(Archive* archive, ReplayOptions options, uint64_t job,
                           state::KvStore* kv)
    : impl_(std::make_unique<Impl>(archive, std::move(options), job, kv)) {}
ReplaySource::~ReplaySource() = default;

Status ReplaySource::Seek(const std::string& resume_cursor) { return impl_->Seek(resume_cursor); }
Result<bool> ReplaySource::Read(EventChunk* chunk) { return impl_->Read(chunk); }
void ReplaySource::Decode(EventChunk* chunk) const { impl_->Decode(chunk); }
std::string ReplaySource::Describe() const { return impl_->Describe(); }
void ReplaySource::Committed(uint64_t through_seq) { impl_->Committed(through_seq); }
uint64_t ReplaySource::tip() const { return impl_->tip_; }
ReplayStats ReplaySource::stats() const { return impl_->stats(); }
uint64_t ReplaySource::account_sweep_start() const { return impl_->account_start_; }

}  // namespace atfill::sources
