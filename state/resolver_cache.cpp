#include "state/resolver_cache.hpp"

#include "state/codec.hpp"

namespace atfill::state {
namespace {

constexpr uint8_t kVersion = 1;
enum Tag : uint32_t {
  kTagPds = 1,
  kTagHandle = 2,
  kTagSigningKey = 3,
  kTagResolvedAt = 4,
  kTagExpiresAt = 5,
};

std::string Encode(const ResolvedDid& e) {
  codec::RecordWriter w(kVersion);
  w.Str(kTagPds, e.pds_endpoint);
  w.Str(kTagHandle, e.handle);
  w.Str(kTagSigningKey, e.signing_key);
  w.Int(kTagResolvedAt, e.resolved_at_us);
  w.Int(kTagExpiresAt, e.expires_at_us);
  return w.Take();
}

Result<ResolvedDid> Decode(std::string_view did, std::string_view bytes) {
  ResolvedDid e;
  bool has_expiry = false;
  const std::string what = "resolver cache entry " + std::string(did);
  ATFILL_RETURN_IF_ERROR(codec::ReadRecord(bytes, kVersion, what, [&](const codec::Field& f) {
    switch (f.tag()) {
      case kTagPds:
        e.pds_endpoint = f.Str();
        break;
      case kTagHandle:
        e.handle = f.Str();
        break;
      case kTagSigningKey:
        e.signing_key = f.Str();
        break;
      case kTagResolvedAt: {
        ATFILL_ASSIGN_OR_RETURN(e.resolved_at_us, f.Int());
        break;
      }
      case kTagExpiresAt: {
        ATFILL_ASSIGN_OR_RETURN(e.expires_at_us, f.Int());
        has_expiry = true;
        break;
      }
      default:
        break;
    }
    return Status::OK();
  }));
  if (!has_expiry) return Status::Corrupt(what + ": no expiry field");
  return e;
}

}  // namespace

void ResolverCache::Put(WriteBatch* batch, std::string_view did, const ResolvedDid& entry) {
  batch->Put(Family::kResolver, did, Encode(entry));
}

Status ResolverCache::Store(std::string_view did, const ResolvedDid& entry) {
  WriteBatch batch;
  Put(&batch, did, entry);
  return kv_.Write(batch);
}

Result<std::optional<ResolvedDid>> ResolverCache::Get(std::string_view did, int64_t now_us) {
  ATFILL_ASSIGN_OR_RETURN(auto raw, kv_.Get(Family::kResolver, did));
  if (!raw) return std::optional<ResolvedDid>();
  ATFILL_ASSIGN_OR_RETURN(ResolvedDid e, Decode(did, *raw));
  if (e.expires_at_us <= now_us) return std::optional<ResolvedDid>();
  return std::optional<ResolvedDid>(std::move(e));
}

void ResolverCache::Remove(WriteBatch* batch, std::string_view did) {
  batch->Delete(Family::kResolver, did);
}

Result<uint64_t> ResolverCache::SweepExpired(int64_t now_us) {
  WriteBatch batch;
  uint64_t n = 0;
  Status error;
  ATFILL_RETURN_IF_ERROR(
      kv_.Scan(Family::kResolver, "", [&](std::string_view key, std::string_view value) {
        auto e = Decode(key, value);
        if (!e.ok()) {
          error = e.status();
          return false;
        }
        if (e->expires_at_us <= now_us) {
          batch.Delete(Family::kResolver, key);
          ++n;
        }
        return true;
      }));
  ATFILL_RETURN_IF_ERROR(error);
  ATFILL_RETURN_IF_ERROR(kv_.Write(batch));
  return n;
}

}  // namespace atfill::state
