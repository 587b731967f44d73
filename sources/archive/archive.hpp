// A Jetstream v2 archive (SPEC §3): sealed `.jss` segments, listed, planned and read block by
// block. LocalArchive serves a directory of segment files (one the user keeps with
// `atfill archive write`, or a copy of a Jetstream's data directory); an HTTP client of the
// archive XRPC API implements the same interface.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "base/status.hpp"
#include "sources/archive/jss.hpp"

namespace atfill::sources {

// One sealed segment, as listSegments describes it.
struct SegmentInfo {
  std::string name;  // seg_XXXXXXXXXX.jss
  uint64_t index = 0;
  uint64_t min_seq = 0;
  uint64_t max_seq = 0;
  int64_t min_witnessed_at = 0;
  int64_t max_witnessed_at = 0;
  uint64_t event_count = 0;
  uint64_t size_bytes = 0;
  std::string checksum;  // 16 lowercase hex digits
};

// What to replay (planSnapshot's request): the window (after_seq, before_seq] (before_seq 0 =
// no upper bound) and the filters; empty lists match all.
struct PlanRequest {
  std::vector<std::string> collections;  // NSIDs or "prefix.*"; constrain commits only
  std::vector<std::string> dids;
  bool commits = true;  // kinds create/update/delete/resync rows
  bool markers = true;  // kinds identity/account/sync
  uint64_t after_seq = 0;
  uint64_t before_seq = 0;
};

// One block a plan selected.
struct PlannedBlock {
  uint32_t index = 0;
  uint64_t min_seq = 0;
  uint64_t max_seq = 0;
  uint32_t uncompressed_size = 0;  // 0 when the planner does not know it
};

struct PlannedSegment {
  SegmentInfo segment;
  std::vector<PlannedBlock> blocks;  // ascending
};

struct Plan {
  uint64_t sealed_tip = 0;       // the newest sealed seq (capped by before_seq); 0 = empty
  uint64_t planned_through = 0;  // the plan covers (after_seq, planned_through]
  std::vector<PlannedSegment> segments;
};

// How an asynchronous archive call answers: exactly once, on any thread (the archive's I/O
// thread, or the caller's own before the Start call returns). It must be cheap and must not
// block: store the answer and wake whoever waits for it.
template <typename T>
using ArchiveCallback = std::function<void(Result<T>)>;

// Every method is thread-safe. The blocking forms wait for their answer on the calling thread;
// the Start forms hand the request over and return. An archive over the network (HttpArchive)
// runs its Start forms on its I/O loop and never blocks in them; a local one (LocalArchive)
// keeps the defaults, which answer on the calling thread from files (local input, which a
// source's Read may wait for).
class Archive {
 public:
  virtual ~Archive() = default;
  virtual std::string Describe() const = 0;
  // Every sealed segment, ascending.
  virtual Result<std::vector<SegmentInfo>> ListSegments() = 0;
  // The blocks that may hold rows matching `request` (false positives only), in seq order.
  virtual Result<Plan> PlanSnapshot(const PlanRequest& request) = 0;
  // The raw zstd frame of one block (getBlock's answer, no length prefix).
  virtual Result<std::string> GetBlock(const SegmentInfo& segment, uint32_t block) = 0;

  // Asynchronous ListSegments, PlanSnapshot and GetBlock: the same answers, through `done`.
  virtual void StartListSegments(ArchiveCallback<std::vector<SegmentInfo>> done) {
    done(ListSegments());
  }
  virtual void StartPlanSnapshot(const PlanRequest& request, ArchiveCallback<Plan> done) {
    done(PlanSnapshot(request));
  }
  virtual void StartGetBlock(const SegmentInfo& segment, uint32_t block,
                             ArchiveCallback<std::string> done) {
    done(GetBlock(segment, block));
  }
};

// The blocks of one segment `request` may match (the server's planner rules, §3.1): blocks with
// rows, inside the window, whose DID bloom may hold one of the DIDs and whose collection bitmask
// has a wanted collection (or a marker sentinel when markers are wanted).
std::vector<PlannedBlock> PlanSegment(const jss::SegmentReader& segment,
                                      const PlanRequest& request);

// Segment files "seg_*.jss" of a directory (sealed ones; active or broken files are skipped with a
// warning on stderr). The listing is read when the archive opens and on each ListSegments.
class LocalArchive : public Archive {
 public:
  static Result<std::unique_ptr<LocalArchive>> Open(const std::string& dir);

  std::string Describe() const override;
  Result<std::vector<SegmentInfo>> ListSegments() override;
  Result<Plan> PlanSnapshot(const PlanRequest& request) override;
  Result<std::string> GetBlock(const SegmentInfo& segment, uint32_t block) override;

 private:
  explicit LocalArchive(std::string dir) : dir_(std::move(dir)) {}
  Status Scan();
  Result<std::shared_ptr<const jss::SegmentReader>> Reader(const std::string& name);

  std::string dir_;
  std::mutex mu_;
  // By segment index.
  std::map<uint64_t, std::shared_ptr<const jss::SegmentReader>> segments_;
};

}  // namespace atfill::sources
