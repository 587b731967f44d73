#include "sources/archive/archive_http_internal.hpp"

namespace atfill::sources {

// --- options ---

Status HttpArchiveOptions::Validate() const {
  if (OriginOf(base_url).empty()) {
    return Status::Invalid("archive URL " + QuoteForMessage(base_url, 200) +
                           " is not an http:// or https:// URL with a host");
  }
  for (const char c : key) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x21 || u == 0x7F) {
      return Status::Invalid("the archive key holds a space or a control character");
    }
  }
  const auto positive = [](std::string_view name, int64_t v) {
    return v >= 1 && v <= kDayMs
               ? Status::OK()
               : Status::Invalid(std::string(name) + " must be 1.." + std::to_string(kDayMs) +
                                 " ms, not " + std::to_string(v));
  };
  ATFILL_RETURN_IF_ERROR(positive("connect_timeout_ms", connect_timeout_ms));
  ATFILL_RETURN_IF_ERROR(positive("request_timeout_ms", request_timeout_ms));
  if (max_connections < 1 || max_connections > 1000) {
    return Status::Invalid("max_connections must be 1..1000");
  }
  if (max_frame_bytes < 1 || max_frame_bytes > (uint64_t{1} << 40) || max_json_bytes < 1 ||
      max_json_bytes > (uint64_t{1} << 40)) {
    return Status::Invalid("max_frame_bytes and max_json_bytes must be 1 byte..1 TiB");
  }
  if (retry_delays_ms.size() > 100) return Status::Invalid("at most 100 retry delays");
  for (const int64_t d : retry_delays_ms) {
    if (d < 0 || d > kDayMs) return Status::Invalid("retry delays must be 0..86400000 ms");
  }
  if (unavailable_retries > 100) return Status::Invalid("unavailable_retries must be 0..100");
  if (max_retry_after_ms < 0 || throttle_default_wait_ms < 0 || max_throttled_ms < 0) {
    return Status::Invalid(
        "max_retry_after_ms, throttle_default_wait_ms and max_throttled_ms must not be negative");
  }
  if (spool_chunk_bytes < 1 || max_spool_segment_bytes < 1) {
    return Status::Invalid("spool_chunk_bytes and max_spool_segment_bytes must be positive");
  }
  if (index_fetch_concurrency < 1 || index_fetch_concurrency > 64) {
    return Status::Invalid("index_fetch_concurrency must be 1..64");
  }
  if (index_cache_segments < 1) return Status::Invalid("index_cache_segments must be at least 1");
  if (max_redirects < 0 || max_redirects > 20)
    return Status::Invalid("max_redirects must be 0..20");
  return Status::OK();
}

HttpArchive::HttpArchive(HttpArchiveOptions options) : options_(std::move(options)) {}

HttpArchive::~HttpArchive() {
  Cancel();
  // The download threads end once their request is cancelled; their files go with them.
  std::list<std::shared_ptr<Spool>> spools;
  {
    std::lock_guard lock(mu_);
    spools.swap(spools_);
    spools.splice(spools.end(), retired_);
  }
  spools.clear();
}

Result<std::unique_ptr<HttpArchive>> HttpArchive::Open(HttpArchiveOptions options) {
  ATFILL_RETURN_IF_ERROR(options.Validate());
  std::unique_ptr<HttpArchive> a(new HttpArchive(std::move(options)));
  const HttpArchiveOptions& o = a->options_;
  std::string_view base = o.base_url;
  while (!base.empty() && base.back() == '/') base.remove_suffix(1);
  a->base_ = std::string(base);

  net::HttpClientOptions h;
  h.user_agent = o.user_agent;
  h.max_in_flight = o.max_connections;
  h.max_per_host = o.max_connections;
  h.connect_timeout_ms = o.connect_timeout_ms;
  h.timeout_ms = o.request_timeout_ms;
  h.max_response_bytes = std::max(o.max_frame_bytes, o.max_json_bytes);
  h.max_redirects = o.max_redirects;
  // The archive's schedule, exactly: no retry when it is empty.
  h.retry.max_attempts = 1;
  h.retry.base_backoff_ms = 0;
  h.retry.max_backoff_ms = 0;
  h.retry.delays_ms = o.retry_delays_ms;
  h.retry.unavailable_retries = static_cast<int>(o.unavailable_retries);
  h.retry.max_retry_after_ms = o.max_retry_after_ms;
  // 0 would let a 429 use an attempt; the shortest cap is the nearest to "fail when throttled".
  h.retry.max_throttled_ms = std::max<int64_t>(o.max_throttled_ms, 1);
  h.rate_limit.default_wait_ms = o.throttle_default_wait_ms;
  h.rate_limit.max_wait_ms = std::max(o.max_throttled_ms, o.throttle_default_wait_ms);
  h.quota.header = std::string(kArchiveQuotaHeader);
  h.quota.scope = o.key;
  // The schedule bounds a request's retries; the client's circuit breaker would cut them short.
  h.host_failure_threshold = 1000;
  h.allow_private_addresses = o.allow_private_addresses;
  ATFILL_ASSIGN_OR_RETURN(a->http_, net::HttpClient::Start(std::move(h)));
  return a;
}

std::string HttpArchive::Describe() const { return "archive " + base_; }

void HttpArchive::Cancel() {
  {
    std::lock_guard lock(mu_);
    cancelled_ = true;
    for (const auto& spool : spools_) {
      std::lock_guard spool_lock(spool->mu);
      spool->stop = true;
    }
  }
  if (http_) http_->Shutdown();
}

HttpArchiveStats HttpArchive::stats() const {
  const net::HttpClientStats h = http_->stats();
  HttpArchiveStats s;
  s.requests = h.attempts;
  s.retries = h.retries;
  s.throttled = h.rate_limited;
  s.bytes = h.bytes_received;
  s.paced_ms = h.paced_ms;
  std::lock_guard lock(mu_);
  s.index_fetches = index_fetches_;
  s.spooled_segments = spooled_segments_;
  s.spooled_blocks = spooled_blocks_;
  s.spool_failures = spool_failures_;
  return s;
}

void HttpArchive::Execute(Call call, std::function<void(Result<net::HttpResponse>)> done) {
  std::string where = "archive " + call.method + " " + call.url;
  {
    std::lock_guard lock(mu_);
    if (cancelled_) return done(Status::Cancelled(where + ": cancelled"));
  }
  net::HttpRequest request;
  request.method = std::move(call.method);
  request.url = std::move(call.url);
  request.headers = std::move(call.headers);
  request.body = std::move(call.body);
  request.max_response_bytes = call.max_bytes;
  if (call.auth && !options_.key.empty()) {
    request.credentials.emplace_back("Authorization", "Bearer " + options_.key);
  }
  http_->Submit(std::move(request),
                [where = std::move(where), has_key = !options_.key.empty(), done = std::move(done)](
                    Result<net::HttpResponse> r) { done(Classify(where, has_key, std::move(r))); });
}

Result<net::HttpResponse> HttpArchive::ExecuteAndWait(Call call) {
  return Await<net::HttpResponse>([&](auto done) { Execute(std::move(call), std::move(done)); });
}

// --- listSegments ---

Result<std::vector<SegmentInfo>> HttpArchive::ListSegments() {
  return Await<std::vector<SegmentInfo>>([&](auto done) { StartListSegments(std::move(done)); });
}

void HttpArchive::StartListSegments(ArchiveCallback<std::vector<SegmentInfo>> done) {
  auto job = std::make_shared<ListJob>();
  job->done = std::move(done);
  ListPage(std::move(job));
}

void HttpArchive::ListPage(std::shared_ptr<ListJob> job) {
  if (job->page++ >= kMaxListPages) {
    return job->done(Status::Invalid("archive " + base_ + ": listSegments did not end after " +
                                     std::to_string(kMaxListPages) + " pages"));
  }
  Call call;
  call.url = base_ + std::string(kNsid) + "listSegments?limit=1000";
  if (!job->cursor.empty()) {
    call.url += "&cursor=";
    net::AppendPercentEncoded(job->cursor, &call.url);
  }
  call.max_bytes = options_.max_json_bytes;
  std::string where = "archive listSegments " + call.url;
  Execute(std::move(call), [this, job, where = std::move(where)](Result<net::HttpResponse> r) {
    if (!r.ok()) return job->done(r.status());
    if (r->status != 200) {
      return job->done(Status::Invalid(where + ": unexpected HTTP " + std::to_string(r->status)));
    }
    std::string next;
    if (Status st = ParseSegmentsPage(r->body, where, &job->out, &next); !st.ok()) {
      return job->done(st);
    }
    if (next.empty()) return job->done(std::move(job->out));
    if (next == job->cursor) {
      return job->done(Status::Invalid(where + ": the listing cursor did not advance"));
    }
    job->cursor = std::move(next);
    ListPage(job);
  });
}

// --- block indexes ---

void HttpArchive::FetchIndex(const std::string& name, const std::string& checksum,
                             IndexCallback done) {
  // One ranged getSegment read, pinned to `etag` (empty = unpinned). `whole` is set when the
  // server sent the whole file instead (no range support, or the file changed).
  struct Read {
    std::string body;
    uint64_t file_size = 0;
    bool whole = false;
  };
  using ReadCallback = std::function<void(Result<Read>)>;
  const auto read = [this, name](const std::string& etag, uint64_t offset, uint64_t length,
                                 ReadCallback then) {
    Call call;
    call.url = base_ + std::string(kNsid) + "getSegment?name=";
    net::AppendPercentEncoded(name, &call.url);
    call.auth = true;
    call.max_bytes = options_.max_json_bytes;
    call.headers.emplace_back(
        "Range", "bytes=" + std::to_string(offset) + "-" + std::to_string(offset + length - 1));
    if (!etag.empty()) call.headers.emplace_back("If-Range", "\"" + etag + "\"");
    std::string where = "archive getSegment " + call.url;
    Execute(std::move(call), [where = std::move(where), offset, length,
                              then = std::move(then)](Result<net::HttpResponse> r) {
      if (!r.ok()) return then(r.status());
      Read out;
      if (r->status == 200) {
        out.file_size = r->body.size();
        out.body = std::move(r->body);
        out.whole = true;
        return then(std::move(out));
      }
      if (r->status != 206) {
        return then(Status::Invalid(where + ": unexpected HTTP " + std::to_string(r->status)));
      }
      uint64_t first = 0, last = 0;
      if (!ParseContentRange(r->content_range(), &first, &last, &out.file_size) ||
          first != offset || last - first + 1 != r->body.size() || r->body.size() != length) {
        return then(Status::Invalid(where + ": bad Content-Range " +
                                    QuoteForMessage(r->content_range(), 100) + " for bytes " +
                                    std::to_string(offset) + "+" + std::to_string(length) + " (" +
                                    std::to_string(r->body.size()) + " bytes received)"));
      }
      out.body = std::move(r->body);
      then(std::move(out));
    });
  };
  const std::string where = "archive " + base_ + " segment " + name;
  // Header and index from the whole file.
  const auto from_file =
      [where](const std::string& file) -> Result<std::shared_ptr<const BlockIndex>> {
    auto index = std::make_shared<BlockIndex>();
    auto header = jss::ParseHeader(AsBytes(file), file.size());
    if (!header.ok()) return header.status().WithContext(where);
    index->header = *header;
    index->file_size = file.size();
    index->checksum = Hex16(header->checksum);
    const jss::Header& h = index->header;
    ATFILL_ASSIGN_OR_RETURN(
        index->blocks, ParseBlockIndex(std::string_view(file).substr(
                                           h.block_index_offset,
                                           uint64_t{h.block_count} * jss::kBlockIndexEntrySize),
                                       h.block_count, where));
    return std::shared_ptr<const BlockIndex>(std::move(index));
  };
  read(checksum, 0, jss::kHeaderSize,
       [this, read, from_file, where, done = std::move(done)](Result<Read> head) {
         if (!head.ok()) return done(head.status());
         if (head->whole) return done(from_file(head->body));
         auto header = jss::ParseHeader(AsBytes(head->body), head->file_size);
         if (!header.ok()) return done(header.status().WithContext(where));
         auto index = std::make_shared<BlockIndex>();
         index->header = *header;
         index->file_size = head->file_size;
         index->checksum = Hex16(header->checksum);
         const jss::Header& h = index->header;
         const uint64_t index_bytes = uint64_t{h.block_count} * jss::kBlockIndexEntrySize;
         if (h.block_index_offset + index_bytes > h.did_bloom_offset) {
           return done(Status::Corrupt(
               where + ": the block index of " + std::to_string(h.block_count) +
               " blocks runs past the DID bloom at " + std::to_string(h.did_bloom_offset)));
         }
         if (index_bytes > options_.max_json_bytes) {
           return done(Status::OutOfRange(where + ": the block index of " +
                                          std::to_string(h.block_count) +
                                          " blocks is over max_json_bytes"));
         }
         if (h.block_count == 0) return done(std::shared_ptr<const BlockIndex>(std::move(index)));
         const std::string etag = index->checksum;
         const uint64_t offset = h.block_index_offset;
         read(etag, offset, index_bytes, [index, from_file, where, done](Result<Read> bytes) {
           if (!bytes.ok()) return done(bytes.status());
           if (bytes->whole) return done(from_file(bytes->body));
           auto blocks = ParseBlockIndex(bytes->body, index->header.block_count, where);
           if (!blocks.ok()) return done(blocks.status());
           index->blocks = std::move(*blocks);
           done(std::shared_ptr<const BlockIndex>(index));
         });
       });
}

std::shared_ptr<const HttpArchive::BlockIndex> HttpArchive::CachedIndex(
    const std::string& name, const std::string& checksum) {
  std::lock_guard lock(mu_);
  auto it = indexes_.find(name);
  if (it == indexes_.end() || (!checksum.empty() && it->second.first->checksum != checksum)) {
    return nullptr;
  }
  lru_.splice(lru_.begin(), lru_, it->second.second);
  return it->second.first;
}

void HttpArchive::Index(const std::string& name, const std::string& checksum, IndexCallback done) {
  if (auto cached = CachedIndex(name, checksum)) return done(std::move(cached));
  FetchIndex(name, checksum,
             [this, name, done = std::move(done)](Result<std::shared_ptr<const BlockIndex>> r) {
               if (r.ok()) {
                 std::lock_guard lock(mu_);
                 ++index_fetches_;
                 auto it = indexes_.find(name);
                 if (it != indexes_.end()) {
                   lru_.erase(it->second.second);
                   indexes_.erase(it);
                 }
                 lru_.push_front(name);
                 indexes_.emplace(name, std::make_pair(*r, lru_.begin()));
                 while (indexes_.size() > options_.index_cache_segments) {
                   indexes_.erase(lru_.back());
                   lru_.pop_back();
                 }
               }
               done(std::move(r));
             });
}

// --- planSnapshot ---

Result<Plan> HttpArchive::PlanSnapshot(const PlanRequest& request) {
  return Await<Plan>([&](auto done) { StartPlanSnapshot(request, std::move(done)); });
}

void HttpArchive::StartPlanSnapshot(const PlanRequest& request, ArchiveCallback<Plan> done) {
  JsonWriter w;
  w.BeginObject();
  const bool nothing = !request.commits && !request.markers;
  if (!request.commits || !request.markers) {
    w.Key("kinds").BeginArray();
    if (request.commits || nothing) w.String("commit");
    if (request.markers) w.String("account").String("identity").String("sync");
    w.EndArray();
  }
  if (!request.dids.empty()) {
    w.Key("dids").BeginArray();
    for (const std::string& d : request.dids) w.String(d);
    w.EndArray();
  }
  if (request.commits && !request.collections.empty()) {
    w.Key("collections").BeginArray();
    for (const std::string& c : request.collections) w.String(c);
    w.EndArray();
  }
  w.Key("afterSeq").Uint(request.after_seq);
  if (request.before_seq != 0) w.Key("beforeSeq").Uint(request.before_seq);
  w.EndObject();

  Call call;
  call.method = "POST";
  call.url = base_ + std::string(kNsid) + "planSnapshot";
  call.body = w.Take();
  call.headers.emplace_back("Content-Type", "application/json");
  call.auth = true;
  call.max_bytes = options_.max_json_bytes;
  auto job = std::make_shared<PlanJob>();
  job->request = request;
  job->where = "archive planSnapshot " + call.url;
  job->done = std::move(done);
  Execute(std::move(call), [this, job, nothing](Result<net::HttpResponse> r) {
    const std::string& where = job->where;
    if (!r.ok()) return job->done(r.status());
    if (r->status != 200) {
      return job->done(Status::Invalid(where + ": unexpected HTTP " + std::to_string(r->status)));
    }
    const auto parse = [&]() -> Status {
      ATFILL_ASSIGN_OR_RETURN(Value root, ParseObject(r->body, where));
      const Fields f(root, where);
      ATFILL_ASSIGN_OR_RETURN(job->plan.sealed_tip, f.Uint("sealedTipSeq"));
      ATFILL_ASSIGN_OR_RETURN(job->plan.planned_through,
                              f.Uint("plannedThroughSeq", job->plan.sealed_tip));
      ATFILL_ASSIGN_OR_RETURN(const Value::Array* segments, f.Array("segments"));
      for (size_t i = 0; i < (nothing ? 0 : segments->size()); ++i) {
        const std::string at = where + ": segments[" + std::to_string(i) + "]";
        const Value& s = (*segments)[i];
        if (s.kind() != Value::Kind::kMap) return Status::Invalid(at + " is not an object");
        const Fields g(s, at);
        PlanJob::Entry e;
        ATFILL_ASSIGN_OR_RETURN(e.name, SegmentNameField(g, at));
        ATFILL_ASSIGN_OR_RETURN(e.checksum, g.String("checksum", ""));
        ATFILL_ASSIGN_OR_RETURN(std::string mode, g.String("mode"));
        if (mode == "segment") {
          e.whole = true;
        } else if (mode == "blocks") {
          ATFILL_ASSIGN_OR_RETURN(const Value::Array* blocks, g.Array("blocks"));
          for (size_t j = 0; j < blocks->size(); ++j) {
            const std::string bat = at + ".blocks[" + std::to_string(j) + "]";
            const Value& range = (*blocks)[j];
            if (range.kind() != Value::Kind::kMap) {
              return Status::Invalid(bat + " is not an object");
            }
            const Fields rf(range, bat);
            ATFILL_ASSIGN_OR_RETURN(uint64_t first, rf.Uint("first"));
            ATFILL_ASSIGN_OR_RETURN(uint64_t last, rf.Uint("last"));
            if (first > last || (!e.ranges.empty() && first <= e.ranges.back().second)) {
              return Status::Invalid(bat + ": range " + std::to_string(first) + ".." +
                                     std::to_string(last) + " is empty or out of order");
            }
            e.ranges.emplace_back(first, last);
          }
        } else {
          return Status::Invalid(at + ": unknown mode " + QuoteForMessage(mode));
        }
        job->entries.push_back(std::move(e));
      }
      return Status::OK();
    };
    if (Status st = parse(); !st.ok()) return job->done(st);
    job->indexes.resize(job->entries.size());
    NextIndexes(job);
  });
}

void HttpArchive::NextIndexes(const std::shared_ptr<PlanJob>& job) {
  const size_t limit = static_cast<size_t>(options_.index_fetch_concurrency);
  while (true) {
    size_t i = 0;
    {
      std::lock_guard lock(job->mu);
      const bool over = !job->error.ok() || job->finished == job->entries.size();
      if (over && job->active == 0) {
        if (job->reported) return;
        job->reported = true;
        break;  // finish below, outside the lock
      }
      if (!job->error.ok() || job->next >= job->entries.size() || job->active >= limit) return;
      i = job->next++;
      // Cached indexes are taken here, so that a plan of many cached segments does not recurse.
      if (auto cached = CachedIndex(job->entries[i].name, job->entries[i].checksum)) {
        job->indexes[i] = std::move(cached);
        ++job->finished;
        continue;
      }
      ++job->active;
    }
    Index(job->entries[i].name, job->entries[i].checksum,
          [this, job, i](Result<std::shared_ptr<const BlockIndex>> index) {
            {
              std::lock_guard lock(job->mu);
              --job->active;
              ++job->finished;
              if (index.ok()) {
                job->indexes[i] = std::move(*index);
              } else if (job->error.ok()) {
                job->error = index.status();
              }
            }
            NextIndexes(job);
          });
  }
  if (!job->error.ok()) return job->done(job->error);
  FinishPlan(job);
}

void HttpArchive::FinishPlan(const std::shared_ptr<PlanJob>& job) {
  const PlanRequest& request = job->request;
  Plan& plan = job->plan;
  for (size_t i = 0; i < job->entries.size(); ++i) {
    const PlanJob::Entry& e = job->entries[i];
    const BlockIndex& index = *job->indexes[i];
    const jss::Header& h = index.header;
    PlannedSegment p;
    SegmentInfo& info = p.segment;
    info.name = e.name;
    info.index = *jss::ParseSegmentName(e.name);
    info.min_seq = h.min_seq;
    info.max_seq = h.max_seq;
    info.min_witnessed_at = h.min_witnessed_at;
    info.max_witnessed_at = h.max_witnessed_at;
    info.event_count = h.event_count;
    info.size_bytes = index.file_size;
    info.checksum = index.checksum;
    const auto add = [&](uint32_t b) {
      const jss::BlockInfo& bi = index.blocks[b];
      p.blocks.push_back({b, bi.min_seq, bi.max_seq, bi.uncompressed_size});
    };
    if (e.whole) {
      for (uint32_t b = 0; b < index.blocks.size(); ++b) {
        const jss::BlockInfo& bi = index.blocks[b];
        if (bi.event_count == 0 || bi.max_seq <= request.after_seq) continue;
        if (request.before_seq != 0 && bi.min_seq > request.before_seq) continue;
        add(b);
      }
      if (!p.blocks.empty() && !options_.spool_dir.empty() &&
          index.file_size <= options_.max_spool_segment_bytes) {
        std::lock_guard lock(mu_);
        whole_[e.name] = p.blocks.front().index;
      }
    } else {
      for (const auto& [first, last] : e.ranges) {
        if (last >= index.blocks.size()) {
          return job->done(Status::Invalid(job->where + ": the plan names block " +
                                           std::to_string(last) + " of " + e.name + ", which has " +
                                           std::to_string(index.blocks.size()) + " blocks"));
        }
        for (uint64_t b = first; b <= last; ++b) add(static_cast<uint32_t>(b));
      }
    }
    if (!p.blocks.empty()) plan.segments.push_back(std::move(p));
  }
  job->done(std::move(plan));
}

}  // namespace atfill::sources
