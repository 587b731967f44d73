// The archive's blocks (sources/archive/archive_http.hpp): one block fetched by range, or its
// segment downloaded once into the spool and read from there.
#include "sources/archive/archive_http_internal.hpp"

namespace atfill::sources {

// --- blocks ---

Result<std::string> HttpArchive::GetBlock(const SegmentInfo& segment, uint32_t block) {
  return Await<std::string>([&](auto done) { StartGetBlock(segment, block, std::move(done)); });
}

void HttpArchive::StartGetBlock(const SegmentInfo& segment, uint32_t block,
                                ArchiveCallback<std::string> done) {
  if (SpoolBlock(segment, block, &done)) return;
  FetchBlock(segment, block, std::move(done));
}

void HttpArchive::FetchBlock(const SegmentInfo& segment, uint32_t block,
                             ArchiveCallback<std::string> done) {
  Call call;
  call.url = base_ + std::string(kNsid) + "getBlock?segment=";
  net::AppendPercentEncoded(segment.name, &call.url);
  call.url += "&blockIndex=" + std::to_string(block);
  call.auth = true;
  call.max_bytes = options_.max_frame_bytes;
  std::string where = "archive getBlock " + call.url;
  Execute(std::move(call), [where = std::move(where),
                            done = std::move(done)](Result<net::HttpResponse> r) {
    if (!r.ok()) return done(r.status());
    if (r->status != 200) {
      return done(Status::Invalid(where + ": unexpected HTTP " + std::to_string(r->status)));
    }
    done(std::move(r->body));
  });
}

bool HttpArchive::SpoolBlock(const SegmentInfo& segment, uint32_t block,
                             ArchiveCallback<std::string>* done) {
  if (options_.spool_dir.empty() || segment.checksum.empty()) return false;
  const std::string path = (std::filesystem::path(options_.spool_dir) /
                            (segment.name + "." + segment.checksum + ".part"))
                               .string();
  std::shared_ptr<Spool> spool;
  std::list<std::shared_ptr<Spool>> dead;  // destroyed (threads joined) outside the lock
  {
    std::lock_guard lock(mu_);
    if (cancelled_) return false;
    for (auto it = retired_.begin(); it != retired_.end();) {
      std::lock_guard spool_lock((*it)->mu);
      auto here = it++;
      if ((*here)->done) dead.splice(dead.end(), retired_, here);
    }
    for (const auto& s : spools_) {
      if (s->segment.name == segment.name && s->segment.checksum == segment.checksum) spool = s;
    }
    if (spool == nullptr) {
      auto it = whole_.find(segment.name);
      std::error_code ec;
      if (it == whole_.end() || (it->second != block && !std::filesystem::exists(path, ec))) {
        return false;
      }
      std::shared_ptr<const BlockIndex> index;
      if (auto cached = indexes_.find(segment.name);
          cached != indexes_.end() && cached->second.first->checksum == segment.checksum) {
        index = cached->second.first;
      }
      if (index == nullptr || block >= index->blocks.size()) return false;
      auto made = std::make_shared<Spool>();
      made->segment = segment;
      made->path = path;
      made->index = index;
      // The blocks are all a replay reads (the index and blooms came with the plan).
      for (const jss::BlockInfo& bi : index->blocks) {
        made->size = std::max<uint64_t>(made->size, bi.offset + 8 + bi.compressed_size);
      }
      std::filesystem::create_directories(options_.spool_dir, ec);
      made->fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
      if (made->fd < 0) {
        std::fprintf(stderr,
                     "atfill: archive: cannot spool %s to %s (%s); reading it block by block\n",
                     segment.name.c_str(), path.c_str(), std::strerror(errno));
        whole_.erase(segment.name);
        made->path.clear();  // not ours to remove
        dead.push_back(std::move(made));
        return false;
      }
      // A .part file of an earlier run holds a prefix of the same file (the name has its
      // checksum).
      const off_t existing = ::lseek(made->fd, 0, SEEK_END);
      made->have =
          existing > 0 ? std::min<uint64_t>(static_cast<uint64_t>(existing), made->size) : 0;
      // The spools no block waits for are behind the reader: they go.
      for (auto it = spools_.begin(); it != spools_.end();) {
        auto here = it++;
        std::lock_guard spool_lock((*here)->mu);
        if ((*here)->waiters.empty()) {
          (*here)->stop = true;
          retired_.splice(retired_.end(), spools_, here);
        }
      }
      ++spooled_segments_;
      made->thread = std::thread([this, raw = made.get()] { Download(raw); });
      spools_.push_back(made);
      spool = std::move(made);
    }
  }
  dead.clear();
  const uint64_t end = block < spool->index->blocks.size() ? spool->End(block) : UINT64_MAX;
  {
    std::lock_guard lock(spool->mu);
    if (end == UINT64_MAX || (spool->have < end && spool->done)) {
      // Not in this file, or its download failed: by getBlock.
      return false;
    }
    if (spool->have < end) {
      spool->waiters.push_back({block, std::move(*done)});
      return true;
    }
  }
  auto frame =
      ReadSpooled(spool->fd, spool->path, segment.name, block, spool->index->blocks[block]);
  if (frame.ok()) {
    std::lock_guard lock(mu_);
    ++spooled_blocks_;
  }
  (*done)(std::move(frame));
  return true;
}

void HttpArchive::Download(Spool* spool) {
  Status failed = Status::OK();
  const std::string& name = spool->segment.name;
  // Answers the waiters whose blocks are in the file; with `all`, hands the others to getBlock.
  const auto serve = [&](bool all) {
    std::vector<Spool::Waiter> ready, rest;
    {
      std::lock_guard lock(spool->mu);
      for (Spool::Waiter& w : spool->waiters) {
        (spool->have >= spool->End(w.block) ? ready : rest).push_back(std::move(w));
      }
      spool->waiters.clear();
      if (all) {
        spool->done = true;
      } else {
        spool->waiters = std::move(rest);
        rest.clear();
      }
    }
    for (Spool::Waiter& w : ready) {
      auto frame =
          ReadSpooled(spool->fd, spool->path, name, w.block, spool->index->blocks[w.block]);
      if (frame.ok()) {
        std::lock_guard lock(mu_);
        ++spooled_blocks_;
      }
      w.done(std::move(frame));
    }
    for (Spool::Waiter& w : rest) FetchBlock(spool->segment, w.block, std::move(w.done));
  };
  while (true) {
    uint64_t offset = 0;
    {
      std::lock_guard lock(spool->mu);
      if (spool->stop) break;
      offset = spool->have;
    }
    if (offset >= spool->size) break;
    const uint64_t length = std::min(options_.spool_chunk_bytes, spool->size - offset);
    Call call;
    call.url = base_ + std::string(kNsid) + "getSegment?name=";
    net::AppendPercentEncoded(name, &call.url);
    call.auth = true;
    call.max_bytes = options_.max_spool_segment_bytes;
    call.headers.emplace_back(
        "Range", "bytes=" + std::to_string(offset) + "-" + std::to_string(offset + length - 1));
    call.headers.emplace_back("If-Range", "\"" + spool->segment.checksum + "\"");
    const std::string where = "archive getSegment " + call.url;
    // This thread is the spool's own: it waits here so that the file is written in order.
    Result<net::HttpResponse> r = ExecuteAndWait(std::move(call));
    if (!r.ok()) {
      failed = r.status();
      break;
    }
    uint64_t first = 0, last = 0, total = 0;
    if (r->status == 200) {
      // The whole file (the segment changed since the plan, or no range support): its block
      // offsets may differ from the index read, so the spool is given up.
      failed = Status::Unavailable(where +
                                   ": the archive sent the whole segment (HTTP 200) for a "
                                   "ranged read pinned to checksum " +
                                   spool->segment.checksum);
      break;
    }
    if (r->status != 206 || !ParseContentRange(r->content_range(), &first, &last, &total) ||
        first != offset || r->body.size() != length || last - first + 1 != length) {
      failed = Status::Invalid(where + ": bad ranged answer (HTTP " + std::to_string(r->status) +
                               ", Content-Range " + QuoteForMessage(r->content_range(), 100) +
                               ", " + std::to_string(r->body.size()) + " bytes for " +
                               std::to_string(offset) + "+" + std::to_string(length) + ")");
      break;
    }
    if (Status w = PwriteAll(spool->fd, r->body.data(), r->body.size(), offset, spool->path);
        !w.ok()) {
      failed = w;
      break;
    }
    {
      std::lock_guard lock(spool->mu);
      spool->have = offset + length;
    }
    serve(false);
  }
  if (!failed.ok()) {
    std::lock_guard lock(mu_);
    if (failed.code() != StatusCode::kCancelled) {
      ++spool_failures_;
      std::fprintf(stderr, "atfill: archive: spooling %s failed (%s); reading it block by block\n",
                   name.c_str(), failed.message().c_str());
    }
    whole_.erase(name);
  }
  serve(true);
}

}  // namespace atfill::sources
