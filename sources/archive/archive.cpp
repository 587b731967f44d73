#include "sources/archive/archive.hpp"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <filesystem>

#include "pipeline/event.hpp"

namespace atfill::sources {
namespace {

std::string Hex16(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016" PRIx64, v);
  return buf;
}

SegmentInfo InfoOf(const jss::SegmentReader& reader, uint64_t index, const std::string& name,
                   uint64_t size) {
  const jss::Header& h = reader.header();
  SegmentInfo info;
  info.name = name;
  info.index = index;
  info.min_seq = h.min_seq;
  info.max_seq = h.max_seq;
  info.min_witnessed_at = h.min_witnessed_at;
  info.max_witnessed_at = h.max_witnessed_at;
  info.event_count = h.event_count;
  info.size_bytes = size;
  info.checksum = Hex16(h.checksum);
  return info;
}

}  // namespace

std::vector<PlannedBlock> PlanSegment(const jss::SegmentReader& segment,
                                      const PlanRequest& request) {
  const jss::Footer& footer = segment.footer();
  std::vector<PlannedBlock> out;
  // The DIDs the segment may hold at all (its own bloom).
  std::vector<const std::string*> dids;
  for (const std::string& did : request.dids) {
    if (footer.did_bloom.MayContain(did)) dids.push_back(&did);
  }
  if (!request.dids.empty() && dids.empty()) return out;
  // Collection ids that select a block: wanted collections (commits) and sentinels (markers).
  std::vector<size_t> ids;
  for (size_t id = 0; id < footer.collections.size(); ++id) {
    const std::string& name = footer.collections[id].name;
    const bool sentinel = !name.empty() && name[0] == '$';
    if (sentinel ? request.markers
                 : request.commits && pipeline::CollectionMatches(name, request.collections)) {
      ids.push_back(id);
    }
  }
  for (size_t b = 0; b < footer.blocks.size(); ++b) {
    const jss::BlockInfo& info = footer.blocks[b];
    if (info.event_count == 0) continue;
    if (info.max_seq <= request.after_seq) continue;
    if (request.before_seq != 0 && info.min_seq > request.before_seq) continue;
    if (!dids.empty()) {
      bool any = false;
      for (const std::string* did : dids) {
        if (b < footer.block_blooms.size() && footer.block_blooms[b].MayContain(*did)) {
          any = true;
          break;
        }
      }
      if (!any) continue;
    }
    bool wanted = false;
    for (size_t id : ids) {
      if (footer.BlockHasCollection(b, id)) {
        wanted = true;
        break;
      }
    }
    if (!wanted) continue;
    out.push_back({static_cast<uint32_t>(b), info.min_seq, info.max_seq, info.uncompressed_size});
  }
  return out;
}

Result<std::unique_ptr<LocalArchive>> LocalArchive::Open(const std::string& dir) {
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) {
    return Status::NotFound("archive directory " + dir + " does not exist or is not a directory");
  }
  std::unique_ptr<LocalArchive> archive(new LocalArchive(dir));
  ATFILL_RETURN_IF_ERROR(archive->Scan());
  return archive;
}

std::string LocalArchive::Describe() const { return "archive directory " + dir_; }

Status LocalArchive::Scan() {
  std::error_code ec;
  std::filesystem::directory_iterator it(dir_, ec);
  if (ec) return Status::IoError("listing archive directory " + dir_ + ": " + ec.message());
  std::lock_guard lock(mu_);
  for (const auto& entry : it) {
    const std::string name = entry.path().filename().string();
    auto index = jss::ParseSegmentName(name);
    if (!index.ok()) continue;  // not a segment file (a .tmp, a README...)
    if (segments_.count(*index)) continue;
    auto reader = jss::SegmentReader::Open(entry.path().string());
    if (!reader.ok()) {
      std::fprintf(stderr, "atfill: archive: skipping %s: %s\n", entry.path().c_str(),
                   reader.status().message().c_str());
      continue;
    }
    segments_.emplace(*index, std::make_shared<const jss::SegmentReader>(std::move(*reader)));
  }
  return Status::OK();
}

Result<std::vector<SegmentInfo>> LocalArchive::ListSegments() {
  ATFILL_RETURN_IF_ERROR(Scan());
  std::lock_guard lock(mu_);
  std::vector<SegmentInfo> out;
  out.reserve(segments_.size());
  for (const auto& [index, reader] : segments_) {
    std::error_code ec;
    const uint64_t size = std::filesystem::file_size(reader->path(), ec);
    out.push_back(InfoOf(*reader, index, jss::SegmentName(index), ec ? 0 : size));
  }
  return out;
}

Result<Plan> LocalArchive::PlanSnapshot(const PlanRequest& request) {
  ATFILL_ASSIGN_OR_RETURN(auto segments, ListSegments());
  Plan plan;
  for (const SegmentInfo& s : segments) plan.sealed_tip = std::max(plan.sealed_tip, s.max_seq);
  if (request.before_seq != 0) plan.sealed_tip = std::min(plan.sealed_tip, request.before_seq);
  plan.planned_through = plan.sealed_tip;
  for (const SegmentInfo& s : segments) {
    if (s.max_seq <= request.after_seq) continue;
    if (request.before_seq != 0 && s.min_seq > request.before_seq) continue;
    ATFILL_ASSIGN_OR_RETURN(auto reader, Reader(s.name));
    PlannedSegment p{s, PlanSegment(*reader, request)};
    if (!p.blocks.empty()) plan.segments.push_back(std::move(p));
  }
  return plan;
}

Result<std::shared_ptr<const jss::SegmentReader>> LocalArchive::Reader(const std::string& name) {
  ATFILL_ASSIGN_OR_RETURN(uint64_t index, jss::ParseSegmentName(name));
  std::lock_guard lock(mu_);
  auto it = segments_.find(index);
  if (it == segments_.end()) {
    return Status::NotFound("segment " + name + " is not in archive directory " + dir_);
  }
  return it->second;
}

Result<std::string> LocalArchive::GetBlock(const SegmentInfo& segment, uint32_t block) {
  ATFILL_ASSIGN_OR_RETURN(auto reader, Reader(segment.name));
  if (block >= reader->footer().blocks.size()) {
    return Status::NotFound("segment " + segment.name + " has no block " + std::to_string(block));
  }
  return reader->ReadFrame(block);
}

}  // namespace atfill::sources
