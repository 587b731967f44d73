#include "state/crawl_log.hpp"

#include <algorithm>
#include <map>

#include "state/codec.hpp"

namespace atfill::state {
namespace {

constexpr uint8_t kVersion = 1;
enum Tag : uint32_t {
  kTagSeq = 1,
  kTagDid = 2,
  kTagHost = 3,
  kTagRev = 4,
  kTagRecords = 5,
  kTagOutcome = 6,
  kTagFetchedAt = 7,
};

constexpr std::string_view kFields[] = {"units", "done", "errors", "records"};

std::string HostKey(uint64_t job, std::string_view host, std::string_view field) {
  std::string key = codec::KeyWithId("h", job);
  key.append(host);
  key.push_back('\0');
  key.append(field);
  return key;
}

std::string SlotKey(uint64_t job, uint64_t slot) {
  std::string key = codec::KeyWithId("r", job);
  codec::AppendBe64(&key, slot);
  return key;
}

}  // namespace

void CrawlLog::AddHost(WriteBatch* batch, uint64_t job, std::string_view host, int64_t units,
                       int64_t done, int64_t errors, int64_t records) const {
  const int64_t deltas[] = {units, done, errors, records};
  for (size_t i = 0; i < 4; ++i) {
    if (deltas[i] != 0) batch->Add(Family::kJobs, HostKey(job, host, kFields[i]), deltas[i]);
  }
}

Result<std::vector<HostSummary>> CrawlLog::Hosts(uint64_t job) {
  const std::string prefix = codec::KeyWithId("h", job);
  std::map<std::string, HostSummary> hosts;
  Status bad = Status::OK();
  ATFILL_RETURN_IF_ERROR(
      kv_.Scan(Family::kJobs, prefix, [&](std::string_view key, std::string_view value) {
        std::string_view rest = key.substr(prefix.size());
        const size_t nul = rest.find('\0');
        if (nul == std::string_view::npos) {
          bad = Status::Corrupt("crawl log of job " + std::to_string(job) +
                                ": malformed host counter key");
          return false;
        }
        auto decoded = DecodeCounter(value, "crawl log host counter");
        if (!decoded.ok()) {
          bad = decoded.status();
          return false;
        }
        const uint64_t n = *decoded;
        HostSummary& h = hosts[std::string(rest.substr(0, nul))];
        h.host = std::string(rest.substr(0, nul));
        const std::string_view field = rest.substr(nul + 1);
        if (field == "units") h.units = n;
        if (field == "done") h.done = n;
        if (field == "errors") h.errors = n;
        if (field == "records") h.records = n;
        return true;
      }));
  ATFILL_RETURN_IF_ERROR(bad);
  std::vector<HostSummary> out;
  out.reserve(hosts.size());
  for (auto& [_, h] : hosts) out.push_back(std::move(h));
  return out;
}

void CrawlLog::PutRecent(WriteBatch* batch, uint64_t job, const RecentRepo& repo,
                         uint32_t capacity) const {
  codec::RecordWriter w(kVersion);
  w.Uint(kTagSeq, repo.seq);
  w.Str(kTagDid, repo.did);
  w.Str(kTagHost, repo.host);
  w.Str(kTagRev, repo.rev);
  w.Uint(kTagRecords, repo.records);
  w.Str(kTagOutcome, repo.outcome);
  w.Int(kTagFetchedAt, repo.fetched_at_us);
  batch->Put(Family::kJobs, SlotKey(job, repo.seq % std::max<uint32_t>(capacity, 1)), w.Take());
}

Result<uint64_t> CrawlLog::ClearRecent(uint64_t job) {
  WriteBatch batch;
  uint64_t n = 0;
  ATFILL_RETURN_IF_ERROR(kv_.Scan(Family::kJobs, codec::KeyWithId("r", job),
                                  [&](std::string_view key, std::string_view) {
                                    batch.Delete(Family::kJobs, key);
                                    ++n;
                                    return true;
                                  }));
  if (n != 0) ATFILL_RETURN_IF_ERROR(kv_.Write(batch));
  return n;
}

Result<std::vector<RecentRepo>> CrawlLog::Recent(uint64_t job) {
  std::vector<RecentRepo> out;
  Status bad = Status::OK();
  ATFILL_RETURN_IF_ERROR(kv_.Scan(
      Family::kJobs, codec::KeyWithId("r", job), [&](std::string_view, std::string_view value) {
        RecentRepo r;
        bad = codec::ReadRecord(value, kVersion, "recent repo", [&](const codec::Field& f) {
          switch (f.tag()) {
            case kTagSeq: {
              ATFILL_ASSIGN_OR_RETURN(r.seq, f.Uint());
              break;
            }
            case kTagDid:
              r.did = f.Str();
              break;
            case kTagHost:
              r.host = f.Str();
              break;
            case kTagRev:
              r.rev = f.Str();
              break;
            case kTagRecords: {
              ATFILL_ASSIGN_OR_RETURN(r.records, f.Uint());
              break;
            }
            case kTagOutcome:
              r.outcome = f.Str();
              break;
            case kTagFetchedAt: {
              ATFILL_ASSIGN_OR_RETURN(r.fetched_at_us, f.Int());
              break;
            }
            default:
              break;
          }
          return Status::OK();
        });
        if (!bad.ok()) return false;
        out.push_back(std::move(r));
        return true;
      }));
  ATFILL_RETURN_IF_ERROR(bad);
  std::sort(out.begin(), out.end(),
            [](const RecentRepo& a, const RecentRepo& b) { return a.seq > b.seq; });
  return out;
}

Result<uint64_t> CrawlLog::LastRecentSeq(uint64_t job) {
  ATFILL_ASSIGN_OR_RETURN(auto recent, Recent(job));
  return recent.empty() ? uint64_t{0} : recent.front().seq;
}

}  // namespace atfill::state
