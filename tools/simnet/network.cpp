#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <random>

#include "atproto/json.hpp"
#include "atproto/syntax.hpp"
#include "atproto/tid.hpp"
#include "base/json_writer.hpp"
#include "base/sha256.hpp"
#include "tools/simnet/mix.hpp"
#include "tools/simnet/simnet.hpp"

namespace atfill::simnet {
namespace {

// 2024-01-01T00:00:00Z: accounts start within a year of it.
constexpr int64_t kEpochUs = 1'704'067'200'000'000;
constexpr int64_t kYearUs = int64_t{365} * 86'400'000'000;

constexpr const char* kWords[] = {"atproto", "index",  "backfill", "stream", "record", "repo",
                                  "commit",  "merkle", "feed",     "label",  "relay",  "pds",
                                  "sky",     "blue",   "graph",    "like",   "post",   "reply",
                                  "the",     "a",      "of",       "and",    "today",  "network"};

// A 64-bit value determined by the seed, a purpose tag and up to two indexes.
uint64_t Draw(uint64_t seed, uint64_t tag, uint64_t a, uint64_t b = 0) {
  return Mix(Mix(Mix(seed ^ Mix(tag)) ^ a) ^ Mix(b + 0x51ED));
}

enum Tag : uint64_t {
  kTagDid = 1,
  kTagWeb,
  kTagPds,
  kTagStatus,
  kTagPlan,
  kTagBody,
  kTagHostShare,
  kTagCidMismatch,
  kTagOversize,
  kTagBadSignature,
  kTagPrivateEndpoint,
  kTagBadScheme,
};

std::string Numbered(std::string_view prefix, uint64_t n) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%04llu", static_cast<unsigned long long>(n));
  return std::string(prefix) + buf;
}

bool TargetMatches(std::string_view target, std::string_view host) {
  if (target == "*") return true;
  if (target == "pds") return host.starts_with("pds-");
  if (target == "web") return host.starts_with("web-");
  if (host == target) return true;
  return host.size() == target.size() + 10 && host.starts_with(target) &&
         host.ends_with(".localhost");
}

// The per-account record plan: collection and timestamp of each record, in creation order.
struct PlannedRecord {
  uint32_t collection;
  int64_t time_us;
};

std::vector<PlannedRecord> Plan(const SimnetOptions& o, uint32_t index) {
  std::mt19937_64 rng(Draw(o.seed, kTagPlan, index));
  const uint32_t span = o.max_records - o.min_records;
  uint32_t n = o.min_records;
  if (span > 0) {
    const double u = Unit(rng());
    if (o.distribution == RecordCountDistribution::kUniform) {
      n += std::min(span, static_cast<uint32_t>(u * (span + 1)));
    } else {
      n += std::min(span, static_cast<uint32_t>(std::pow(span + 1.0, u)) - 1);
    }
  }
  std::vector<PlannedRecord> plan(n);
  int64_t t = kEpochUs + static_cast<int64_t>(rng() % static_cast<uint64_t>(kYearUs));
  for (PlannedRecord& p : plan) {
    t += 1 + static_cast<int64_t>(rng() % 7'200'000'000);  // up to two hours apart
    p = {static_cast<uint32_t>(rng() % o.collections.size()), t};
  }
  return plan;
}

std::string RecordBody(const SimnetOptions& o, const std::vector<Account>& accounts,
                       const std::string& collection, uint32_t account, uint64_t k, int64_t time_us,
                       bool oversize) {
  std::mt19937_64 rng(Draw(o.seed, kTagBody, account, k));
  const auto words = [&](size_t min_bytes, size_t max_words) {
    std::string text;
    const size_t count = 3 + rng() % max_words;
    for (size_t i = 0; i < count || text.size() < min_bytes; ++i) {
      if (!text.empty()) text.push_back(' ');
      text += kWords[rng() % std::size(kWords)];
    }
    return text;
  };
  const auto other_did = [&] { return accounts[rng() % accounts.size()].did; };
  JsonWriter w;
  w.BeginObject().Key("$type").String(collection);
  if (collection == "app.bsky.feed.like" || collection == "app.bsky.feed.repost") {
    const std::string uri = "at://" + other_did() + "/app.bsky.feed.post/" +
                            atproto::Tid::FromValue(Mix(rng()) >> 1).str();
    const atproto::Cid cid = atproto::Cid::Compute(atproto::Cid::Codec::kDagCbor, AsBytes(uri));
    w.Key("subject").BeginObject().Key("uri").String(uri).Key("cid").String(cid.ToString());
    w.EndObject();
  } else if (collection == "app.bsky.graph.follow" || collection == "app.bsky.graph.block") {
    w.Key("subject").String(other_did());
  } else if (collection == "app.bsky.actor.profile") {
    w.Key("displayName").String(words(0, 2)).Key("description").String(words(0, 12));
  } else {
    w.Key("text").String(words(oversize ? o.oversize_record_bytes : 0, 30));
    w.Key("langs").BeginArray().String("en").EndArray();
    oversize = false;  // the text carries the size
  }
  if (oversize) w.Key("padding").String(words(o.oversize_record_bytes, 1));
  w.Key("createdAt").String(atproto::Datetime::FromUnixMicros(time_us)->str());
  w.EndObject();
  return w.Take();
}

}  // namespace

Status ArchiveOptions::Validate() const {
  if (rows_per_block < 1 || rows_per_block > 262'144) {
    return Status::Invalid("rows_per_block must be 1..262144");
  }
  if (segment_bytes < 1) return Status::Invalid("segment_bytes must be at least 1");
  if (!(whole_segment_threshold >= 0 && whole_segment_threshold <= 1)) {
    return Status::Invalid("whole_segment_threshold must be within 0..1");
  }
  if (max_list_page < 1 || max_list_page > 1000) {
    return Status::Invalid("max_list_page must be 1..1000");
  }
  if (from_jetstream && dir.empty()) return Status::Invalid("from_jetstream needs a directory");
  if (from_repos && dir.empty()) return Status::Invalid("from_repos needs a directory");
  const int s = faults.no_archive_status;
  if (s != 0 && s != 404 && s != 501)
    return Status::Invalid("no_archive_status must be 0, 404 or 501");
  return Status::OK();
}

Status LabelerOptions::Validate() const {
  if (labels > 1'000'000) return Status::Invalid("labeler labels must be at most 1,000,000");
  for (double share : {negation_share, expired_share, expiring_share, bad_signature_share}) {
    if (!(share >= 0 && share <= 1)) return Status::Invalid("labeler shares must be in 0..1");
  }
  if (negation_share + expired_share + expiring_share + bad_signature_share > 1) {
    return Status::Invalid("labeler shares add up to more than 1");
  }
  if (!(frames_per_second >= 0)) return Status::Invalid("labeler frames_per_second is negative");
  return Status::OK();
}

Status SimnetOptions::Validate() const {
  if (accounts == 0 || accounts > 1'000'000) {
    return Status::Invalid("accounts must be 1..1000000, not " + std::to_string(accounts));
  }
  if (pds_hosts == 0 || pds_hosts > 100'000) {
    return Status::Invalid("pds_hosts must be 1..100000, not " + std::to_string(pds_hosts));
  }
  if (collections.empty()) return Status::Invalid("collections must not be empty");
  for (const std::string& c : collections) {
    ATFILL_RETURN_IF_ERROR(atproto::ValidateNsid(c).WithContext("collection \"" + c + "\""));
  }
  if (min_records > max_records || max_records > 1'000'000) {
    return Status::Invalid("records per account must satisfy min <= max <= 1000000");
  }
  const auto share = [](double v) { return v >= 0 && v <= 1; };
  if (!share(did_web_share) || !share(deactivated_share) || !share(takendown_share) ||
      deactivated_share + takendown_share > 1) {
    return Status::Invalid("shares must be within 0..1 (deactivated + takendown at most 1)");
  }
  if (latency_ms < 0 || latency_ms > 600'000)
    return Status::Invalid("latency_ms must be 0..600000");
  if (threads < 1 || threads > 64) return Status::Invalid("threads must be 1..64");
  if (timeout_hold_ms < 0 || timeout_hold_ms > 600'000) {
    return Status::Invalid("timeout_hold_ms must be 0..600000");
  }
  if (oversize_record_bytes == 0 || oversize_record_bytes > (64u << 20)) {
    return Status::Invalid("oversize_record_bytes must be 1..64 MiB");
  }
  ATFILL_RETURN_IF_ERROR(jetstream.Validate());
  ATFILL_RETURN_IF_ERROR(archive.Validate().WithContext("archive"));
  ATFILL_RETURN_IF_ERROR(labeler.Validate().WithContext("labeler"));
  if (archive.from_jetstream && jetstream.events == 0) {
    return Status::Invalid("archive.from_jetstream needs a Jetstream (jetstream.events > 0)");
  }
  for (const FaultRule& rule : faults) {
    if (rule.target.empty()) return Status::Invalid("a fault rule has an empty target");
    if (rule.host_share < 0 || rule.host_share > 1) {
      return Status::Invalid("fault rule for " + rule.target + ": host_share outside 0..1");
    }
  }
  return Status::OK();
}

Result<std::unique_ptr<Network>> Network::Generate(const SimnetOptions& options, uint16_t port) {
  ATFILL_RETURN_IF_ERROR(options.Validate());
  std::unique_ptr<Network> net(new Network());
  net->options_ = options;
  net->port_ = port;
  const uint64_t seed = options.seed;

  net->host_names_ = {"relay.localhost", "plc.localhost"};
  for (uint32_t p = 0; p < options.pds_hosts; ++p) {
    net->host_names_.push_back(Numbered("pds-", p + 1) + ".localhost");
  }

  net->accounts_.resize(options.accounts);
  std::vector<uint32_t> per_pds(options.pds_hosts, 0);
  std::vector<uint32_t> pds_slot(options.accounts, 0);
  int64_t web_hosts = 0;
  for (uint32_t i = 0; i < options.accounts; ++i) {
    Account& a = net->accounts_[i];
    a.index = i;
    a.pds = static_cast<uint32_t>(Draw(seed, kTagPds, i) % options.pds_hosts);
    pds_slot[i] = per_pds[a.pds]++;
    const double status = Unit(Draw(seed, kTagStatus, i));
    a.status = status < options.deactivated_share ? AccountStatus::kDeactivated
               : status < options.deactivated_share + options.takendown_share
                   ? AccountStatus::kTakendown
                   : AccountStatus::kActive;
    a.handle = Numbered("user-", i + 1) + ".simnet.test";
    if (Unit(Draw(seed, kTagWeb, i)) < options.did_web_share) {
      a.web = web_hosts++;
      const std::string host = Numbered("web-", static_cast<uint64_t>(a.web) + 1) + ".localhost";
      net->host_names_.push_back(host);
      a.did = "did:web:" + host + "%3A" + std::to_string(port);
    } else {
      static constexpr char kB32[] = "abcdefghijklmnopqrstuvwxyz234567";
      const std::string label = "simnet-did/" + std::to_string(seed) + "/" + std::to_string(i);
      const Sha256Digest digest = Sha256(AsBytes(label));
      a.did = "did:plc:";
      for (size_t c = 0; c < 24; ++c) a.did.push_back(kB32[digest[c] & 31]);
    }
    // The key: a SHA-256 of seed and index, rehashed in the (astronomically rare) case it is not a
    // valid scalar.
    std::string key_label = "simnet-key/" + std::to_string(seed) + "/" + std::to_string(i);
    for (int attempt = 0;; ++attempt) {
      const Sha256Digest digest = Sha256(AsBytes(key_label));
      Result<atproto::PrivateKey> key = atproto::PrivateKey::FromBytes(
          atproto::KeyType::kSecp256k1, ByteView(digest.data(), digest.size()));
      if (key.ok()) {
        a.key_scalar.assign(digest.begin(), digest.end());
        a.public_key_multibase = key->public_key().ToMultibase();
        break;
      }
      if (attempt > 16) return Status::Internal("no valid key for account " + std::to_string(i));
      key_label.push_back('+');
    }
    const std::vector<PlannedRecord> plan = Plan(options, i);
    a.collection_counts.assign(options.collections.size(), 0);
    int64_t last = kEpochUs;
    for (const PlannedRecord& p : plan) {
      ++a.collection_counts[p.collection];
      last = std::max(last, p.time_us);
    }
    ATFILL_ASSIGN_OR_RETURN(atproto::Tid rev,
                            atproto::Tid::FromParts(static_cast<uint64_t>(last + 1), i % 1024));
    a.rev = rev.str();
  }

  for (size_t h = 0; h < net->host_names_.size(); ++h) net->host_ids_[net->host_names_[h]] = h;
  net->host_faults_.assign(net->host_names_.size(), HostFaults{});
  for (size_t r = 0; r < options.faults.size(); ++r) {
    const FaultRule& rule = options.faults[r];
    for (size_t h = 0; h < net->host_names_.size(); ++h) {
      if (!TargetMatches(rule.target, net->host_names_[h])) continue;
      if (rule.host_share < 1 && Unit(Draw(seed, kTagHostShare, r, h)) >= rule.host_share) continue;
      net->host_faults_[h].Apply(rule.faults);
    }
  }

  for (uint32_t i = 0; i < options.accounts; ++i) {
    Account& a = net->accounts_[i];
    const HostFaults& f = net->host_faults_[net->PdsHostId(a.pds)];
    a.bad_signature = f.bad_signature.Hits(pds_slot[i], Draw(seed, kTagBadSignature, i));
    a.private_endpoint = f.private_endpoint.Hits(pds_slot[i], Draw(seed, kTagPrivateEndpoint, i));
    a.bad_scheme =
        !a.private_endpoint && f.bad_scheme.Hits(pds_slot[i], Draw(seed, kTagBadScheme, i));
    net->did_index_[a.did] = i;
  }
  net->by_did_.resize(options.accounts);
  for (uint32_t i = 0; i < options.accounts; ++i) net->by_did_[i] = i;
  std::sort(net->by_did_.begin(), net->by_did_.end(),
            [&](uint32_t x, uint32_t y) { return net->accounts_[x].did < net->accounts_[y].did; });
  return net;
}

const Account* Network::FindDid(std::string_view did) const {
  auto it = did_index_.find(std::string(did));
  return it == did_index_.end() ? nullptr : &accounts_[it->second];
}

int64_t Network::HostId(std::string_view name) const {
  auto it = host_ids_.find(std::string(name));
  return it == host_ids_.end() ? -1 : static_cast<int64_t>(it->second);
}

std::string Network::Url(size_t host_id) const {
  return "http://" + host_names_[host_id] + ":" + std::to_string(port_);
}

Result<std::vector<GeneratedRecord>> Network::Records(const Account& account) const {
  const std::vector<PlannedRecord> plan = Plan(options_, account.index);
  const HostFaults& f = host_faults_[PdsHostId(account.pds)];
  std::vector<GeneratedRecord> out;
  out.reserve(plan.size());
  for (size_t k = 0; k < plan.size(); ++k) {
    GeneratedRecord r;
    r.collection = options_.collections[plan[k].collection];
    ATFILL_ASSIGN_OR_RETURN(
        atproto::Tid rkey,
        atproto::Tid::FromParts(static_cast<uint64_t>(plan[k].time_us), account.index % 1024));
    r.rkey = rkey.str();
    r.oversize = f.oversize.Hits(k, Draw(options_.seed, kTagOversize, account.index, k));
    r.cid_mismatch = f.cid_mismatch.Hits(k, Draw(options_.seed, kTagCidMismatch, account.index, k));
    r.json = RecordBody(options_, accounts_, r.collection, account.index, k, plan[k].time_us,
                        r.oversize);
    ATFILL_ASSIGN_OR_RETURN(r.cid, atproto::CidOfRecord(r.json));
    out.push_back(std::move(r));
  }
  std::sort(out.begin(), out.end(), [](const GeneratedRecord& x, const GeneratedRecord& y) {
    return x.collection != y.collection ? x.collection < y.collection : x.rkey < y.rkey;
  });
  return out;
}

std::string Network::DidDocument(const Account& account) const {
  std::string endpoint = pds_url(account.pds);
  if (account.private_endpoint) {
    endpoint = "http://10.0.0.1";
  } else if (account.bad_scheme) {
    endpoint = "ftp://" + host_names_[PdsHostId(account.pds)] + ":" + std::to_string(port_);
  }
  JsonWriter w;
  w.BeginObject();
  w.Key("@context").BeginArray();
  w.String("https://www.w3.org/ns/did/v1").String("https://w3id.org/security/multikey/v1");
  w.String("https://w3id.org/security/suites/secp256k1-2019/v1").EndArray();
  w.Key("id").String(account.did);
  w.Key("alsoKnownAs").BeginArray().String("at://" + account.handle).EndArray();
  w.Key("verificationMethod").BeginArray().BeginObject();
  w.Key("id").String(account.did + "#atproto").Key("type").String("Multikey");
  w.Key("controller").String(account.did);
  w.Key("publicKeyMultibase").String(account.public_key_multibase);
  w.EndObject().EndArray();
  w.Key("service").BeginArray().BeginObject();
  w.Key("id").String("#atproto_pds").Key("type").String("AtprotoPersonalDataServer");
  w.Key("serviceEndpoint").String(endpoint);
  w.EndObject().EndArray();
  w.EndObject();
  return w.Take();
}

Result<atproto::PrivateKey> Network::CommitKey(const Account& account) const {
  if (!account.bad_signature) {
    return atproto::PrivateKey::FromBytes(atproto::KeyType::kSecp256k1, account.key_scalar);
  }
  const Sha256Digest other = Sha256(account.key_scalar);
  return atproto::PrivateKey::FromBytes(atproto::KeyType::kSecp256k1,
                                        ByteView(other.data(), other.size()));
}

Result<GroundTruth> Network::Truth() const {
  GroundTruth truth;
  for (uint32_t i : by_did_) {
    const Account& a = accounts_[i];
    TruthAccount t;
    t.did = a.did;
    t.pds_url = pds_url(a.pds);
    t.status = a.status;
    t.bad_signature = a.bad_signature;
    t.bad_endpoint = a.private_endpoint || a.bad_scheme;
    for (uint32_t c : a.collection_counts) t.records += c;
    truth.accounts.push_back(std::move(t));
    if (a.status != AccountStatus::kActive) continue;
    ATFILL_ASSIGN_OR_RETURN(std::vector<GeneratedRecord> records, Records(a));
    for (const GeneratedRecord& r : records) {
      TruthRecord tr;
      tr.uri = "at://" + a.did + "/" + r.collection + "/" + r.rkey;
      tr.cid = r.cid.ToString();
      const auto add = [&](std::string_view fault) {
        if (!tr.faults.empty()) tr.faults.push_back(',');
        tr.faults.append(fault);
      };
      if (r.cid_mismatch) add("cid_mismatch");
      if (r.oversize) add("oversize");
      if (a.bad_signature) add("bad_signature");
      if (a.private_endpoint || a.bad_scheme) add("bad_endpoint");
      truth.records.push_back(std::move(tr));
    }
  }
  std::sort(truth.records.begin(), truth.records.end(),
            [](const TruthRecord& x, const TruthRecord& y) { return x.uri < y.uri; });
  return truth;
}

std::string GroundTruth::ToTsv(bool with_faults) const {
  std::string out;
  for (const TruthRecord& r : records) {
    out.append(r.uri).push_back('\t');
    out.append(r.cid);
    if (with_faults) out.append("\t").append(r.faults.empty() ? "-" : r.faults);
    out.push_back('\n');
  }
  return out;
}

}  // namespace atfill::simnet
