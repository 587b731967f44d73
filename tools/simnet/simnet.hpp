// simnet: a simulated atproto network on loopback, for tests, benchmarks and the demo.
//
// One listening socket on 127.0.0.1 serves every simulated host, told apart by the HTTP Host
// header (libcurl resolves any "*.localhost" name to loopback by itself):
//   relay.localhost:PORT     com.atproto.sync.listReposByCollection, com.atproto.sync.listRepos
//   plc.localhost:PORT       GET /{did}: the DID document of a did:plc account
//   pds-0001.localhost:PORT  com.atproto.repo.listRecords, com.atproto.sync.getRepo (a CAR with
//                            the MST and a signed commit), com.atproto.sync.getRepoStatus (with
//                            a Jetstream: the status its published #account events gave)
//   web-0001.localhost:PORT  GET /.well-known/did.json for one did:web account
//   jetstream.localhost:PORT a Jetstream (when SimnetOptions::jetstream.events > 0; see
//                            jetstream.hpp): GET /subscribe (v1), the v2 WebSocket
//                            network.bsky.jetstream.subscribeEvents and getZstdDictionary
//   archive.localhost:PORT   a Jetstream v2 archive (when SimnetOptions::archive.dir is set):
//                            listSegments, planSnapshot, getSegment, getBlock,
//                            getZstdDictionary (also at jetstream.localhost), with faults
//   cdn.localhost:PORT       where the archive's redirect fault sends getBlock
//   labeler.localhost:PORT   a labeler (when SimnetOptions::labeler.labels > 0; see labeler.hpp):
//                            com.atproto.label.subscribeLabels; its DID document at plc.localhost
// Everything (accounts, keys, records, statuses, which records and accounts carry a fault) is
// derived from the seed, so the ground truth can be printed without serving. Two things are not
// reproducible across processes: commit signatures (OpenSSL's ECDSA is randomized; within one
// Simnet each repo keeps the signature of its first build) and did:web DIDs, which name the port.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "atproto/cid.hpp"
#include "atproto/crypto.hpp"
#include "base/bytes.hpp"
#include "base/status.hpp"
#include "pipeline/event.hpp"

namespace atfill::simnet {

// When a fault hits: with a probability, or by a fixed rule "hit/period" (request number n of the
// host, 0-based, hits when n % period < hit; for record and account faults n is the record's index
// in its repo, or the account's index on its PDS). Both zero = never.
struct FaultRate {
  double probability = 0;  // 0..1
  uint32_t hit = 0;
  uint32_t period = 0;

  bool enabled() const { return probability > 0 || (period > 0 && hit > 0); }
  // `random` is a uniformly distributed 64-bit value drawn for this decision.
  bool Hits(uint64_t n, uint64_t random) const;
};

// The faults of one simulated host. Request faults apply to every request the host answers;
// record faults to the records of accounts on a PDS; account faults to the accounts of a PDS.
struct HostFaults {
  int64_t extra_latency_ms = 0;  // added to SimnetOptions::latency_ms, milliseconds
  // 429 RateLimitExceeded with RateLimit-Reset (unix seconds) and Retry-After (seconds).
  FaultRate rate_limit;
  int64_t rate_limit_reset_s = 2;  // seconds until the advertised reset
  // 500 / 502 / 503 (in turn, or always server_error_status when set).
  FaultRate server_error;
  int server_error_status = 0;
  // No answer: the request is held SimnetOptions::timeout_hold_ms, then the connection closes.
  FaultRate timeout;
  // Content-Length of the whole body, then half of it, then the connection closes.
  FaultRate truncate;
  // listRecords states a CID that is not the record's (the repo CAR stays correct).
  FaultRate cid_mismatch;
  // The record's text is padded to SimnetOptions::oversize_record_bytes.
  FaultRate oversize;
  // getRepo's commit is signed with another key than the DID document's.
  FaultRate bad_signature;
  // The DID document's #atproto_pds endpoint is http://10.0.0.1 (a private address)...
  FaultRate private_endpoint;
  // ...or ftp://<the real host> (not http).
  FaultRate bad_scheme;

  // Copies every field of `other` that is set (non-zero) over this one.
  void Apply(const HostFaults& other);
};

// Faults for the hosts matching `target`: "*", "relay", "plc", "pds" (every PDS), "web" (every
// did:web host) or one host name ("pds-0003" or "pds-0003.localhost"). `host_share` picks that
// share of the matching hosts, deterministically from the seed. Later rules override earlier ones
// field by field.
struct FaultRule {
  std::string target = "*";
  double host_share = 1;
  HostFaults faults;
};

// Parses "RULE;RULE;..." with RULE = "TARGET[@SHARE]:KEY=VALUE,KEY=VALUE,...". Keys: latency_ms,
// rate_limit, reset_s, error, error_status, timeout, truncate, cid_mismatch, oversize,
// bad_signature, private_endpoint, bad_scheme. Rates are a probability ("0.25"), a fixed rule
// ("1/4") or "always". Example: "pds@0.1:rate_limit=0.2,reset_s=1;pds-0002:timeout=always".
Result<std::vector<FaultRule>> ParseFaultSpec(std::string_view spec);

// The simulated Jetstream: a log of `events` events (creates, updates and deletes of records it
// created, #identity and #account events) generated from the seed over the network's accounts,
// with seqs 1..events and strictly increasing simulated witnessed times. Events are published
// on a schedule (the first `published_at_start` at Start, then `events_per_second`); a
// connection replays from its cursor, follows the tip, and after the last event stays open idle.
struct JetstreamOptions {
  // Events in the log, 0..10,000,000; 0 = no Jetstream host.
  uint64_t events = 0;
  // Publication rate after Start, events per second; 0 = everything is published at Start, so a
  // connection with a cursor reads as fast as it consumes.
  double events_per_second = 0;
  // Events published at Start (the rest follow at the rate); default: all when the rate is 0,
  // none otherwise. With a rate of 0 it must be `events`.
  std::optional<uint64_t> published_at_start;
  // Bursts (rate > 0 only): after every `burst_every` events published one per 1/rate, the
  // next `burst_size` events are published at once, in the following slot. 0 = no bursts.
  uint64_t burst_every = 0;
  uint64_t burst_size = 0;
  // Replay window: only the newest `retention_events` published events can be replayed; older
  // seqs are below the floor (v2: CursorTooOld; v1: clamped to the floor). 0 = everything.
  uint64_t retention_events = 0;
  // Witnessed time of the log: seq s is at start_time_us + s*interval_us + a jitter below
  // interval_us (unix microseconds; default 2025-01-01T00:00:00Z).
  int64_t start_time_us = 1'735'689'600'000'000;
  int64_t interval_us = 1000;
  // Shares of the generated kinds (each 0..1, together at most 1); the rest are creates.
  double update_share = 0.15;
  double delete_share = 0.10;
  double identity_share = 0.03;
  double account_share = 0.03;
  // Share of #account "deleted" events that are false: the account's PDS still answers
  // com.atproto.sync.getRepoStatus with active, the account keeps its records (the ground truth
  // does not purge them) and goes on writing. 0..1.
  double false_delete_share = 0;
  // Share of events that are a #sync of an active account that has records (JetstreamKind::kSync;
  // v1 does not carry them, only the resync rows, as creates). 0..1, counted with the other shares.
  double sync_share = 0;
  // Render every v2 frame, and compress it with the v2 dictionary, at Start and keep both in
  // memory (about the log's frame bytes again), so that serving v2 costs simnet only the sends:
  // for benchmarks that measure the consumer rather than simnet. v1 is rendered as it is sent.
  bool prerender = false;
  // Added to every seq this host sends (and taken off seq cursors): another Jetstream instance
  // numbers the same events differently (seqs are per instance; witnessed times agree here).
  uint64_t seq_offset = 0;
  // Faults. Each connection closes its socket without a close frame after writing this many
  // frames (0 = never), or after any frame with this probability.
  uint64_t disconnect_after_frames = 0;
  double disconnect_probability = 0;
  // Slow consumers: once a connection is live (it has passed the tip of when it connected, or
  // caught up with the tip), more than this many published events it has not yet written drop
  // it (v2: error frame ConsumerTooSlow, then the socket closes; v1: the socket closes without
  // a frame). 0 = never. A connection whose pending write does not finish within
  // `slow_drop_grace_ms` of the verdict is closed anyway.
  uint64_t max_send_queue = 0;
  int64_t slow_drop_grace_ms = 2000;
  // SO_SNDBUF of each stream connection, bytes; 0 = the system's. Small values make a slow
  // reader fall behind sooner.
  int send_buffer_bytes = 0;
  // IDs of the dictionaries simnet trains (ZDICT_trainFromBuffer over sample frames) for v1
  // compress=true and for v2 zstdDictionary (served by getZstdDictionary).
  uint32_t v1_dictionary_id = 0x53494D31;  // "SIM1"
  uint32_t v2_dictionary_id = 0x53494D32;  // "SIM2"

  Status Validate() const;
};

// The archive host (archive.localhost; SPEC §3): a Jetstream v2 archive served from the sealed
// `.jss` segments of a directory. Faults are injected per request target, and can be changed
// while simnet runs (Simnet::SetArchiveFaults).
struct ArchiveFault {
  enum class Kind : uint8_t {
    kStatus,    // an XRPC error answer with `status` (and Retry-After when retry_after_s >= 0)
    kCorrupt,   // getBlock/getSegment: bytes of the body flipped; JSON methods: half the JSON
    kDrop,      // no answer: the connection closes
    kTruncate,  // the full Content-Length, half the body, then the connection closes
    kRedirect,  // getBlock: 302 to http://cdn.localhost:PORT/blocks/<segment>/<index>, which
                // serves the frame without asking for a key
  };
  Kind kind = Kind::kStatus;
  int status = 500;
  // Retry-After in seconds; -1 = no header.
  int64_t retry_after_s = -1;
  // Retry-After as an HTTP-date (now + retry_after_s) rather than delta-seconds.
  bool retry_after_date = false;
  // The first `times` requests of the target hit, later ones are served; 0 = every request.
  uint32_t times = 0;
};

struct ArchiveFaults {
  // By target: "listSegments", "planSnapshot", "getSegment", "getBlock" (every request of that
  // method), or "<segment name>/<block index>" (getBlock of one block; checked first).
  std::map<std::string, ArchiveFault> faults;
  // Every archive method answers this: 404 NotFound or 501 MethodNotImplemented ("no archive
  // here"); 0 = serve.
  int no_archive_status = 0;
  // Key planSnapshot, getSegment and getBlock require as "Authorization: Bearer <key>": 401
  // AuthRequired without one, 403 Forbidden for another. Empty = no key needed.
  std::string required_key;
  // A byte quota (bytes per second), advertised on every archive answer in
  // X-Archive-Quota-Bytes-Per-Second and enforced per Authorization value: a token bucket one
  // second deep, charged the body bytes of every answer; a request arriving while its bucket is
  // in debt gets 429 RateLimitExceeded with Retry-After. 0 = none.
  uint64_t quota_bytes_per_second = 0;
};

struct ArchiveOptions {
  // The directory whose sealed segments (seg_*.jss, read at Start) are served; empty = no
  // archive host. The archive methods are also served at jetstream.localhost when it runs.
  std::string dir;
  // At Start, first write the Jetstream log's events (seqs 1..events; after the repos' rows with
  // from_repos) into `dir` as segments (ArchiveWriter); `dir` must then hold no segment yet.
  // Needs jetstream.events > 0.
  bool from_jetstream = false;
  // from_jetstream: only the log's events 1..this (an archive whose sealed tip trails the stream,
  // as a live host's does); 0 = all.
  uint64_t jetstream_through_seq = 0;
  // At Start, first write every active account's current repo into `dir` as Jetstream stores a
  // backfilled repo (SPEC §4.4): one Create row per record (payload = the record's DAG-CBOR block
  // exactly as in the repo getRepo serves, rev = the repo's commit rev), all rows of a repo
  // sharing one witnessed_at, in account order. Deactivated and taken-down accounts are left
  // out: their PDS serves no repo to backfill. The repo of account i (of n) is witnessed at
  // jetstream.start_time_us - (n - i) ms, so with from_jetstream the log follows, its events
  // numbered after the repos' rows (the archive's seqs then differ from the Jetstream host's).
  // `dir` must hold no segment yet.
  bool from_repos = false;
  // from_jetstream / from_repos: rows per block (1..262144).
  uint32_t rows_per_block = 256;
  // from_jetstream / from_repos: seal a segment at this size (bytes, compressed).
  uint64_t segment_bytes = uint64_t{1} << 20;
  // planSnapshot: work entries per page (a whole segment or one block range) before the page is
  // truncated; 0 = unlimited.
  uint32_t max_plan_entries = 100'000;
  // planSnapshot: a segment whose selected share of blocks reaches this is planned whole
  // (mode "segment"); 0..1.
  double whole_segment_threshold = 0.75;
  // listSegments: largest page, whatever `limit` asks (1..1000).
  uint32_t max_list_page = 1000;
  // Faults at Start.
  ArchiveFaults faults;

  Status Validate() const;
};

// The archive host's counters since Start.
struct ArchiveStats {
  uint64_t requests = 0;  // requests to the archive methods (any host) and cdn.localhost
  uint64_t list_segments = 0, plan_snapshots = 0, get_segments = 0, get_blocks = 0;
  uint64_t faults = 0;            // answers replaced by an injected fault
  uint64_t key_rejections = 0;    // 401 and 403 answers
  uint64_t quota_rejections = 0;  // 429 answers of the quota
  uint64_t bytes = 0;             // body bytes of archive answers
  uint64_t cdn_requests = 0;      // requests to cdn.localhost
  // Requests carrying an Authorization header to any host or method that never needs a key
  // (cdn.localhost, listSegments, getZstdDictionary, every other simulated host).
  uint64_t authorization_elsewhere = 0;
};

enum class RecordCountDistribution {
  kUniform,     // records per account uniform in [min_records, max_records]
  kLogUniform,  // log-uniform: many small repos, a few large ones (as on the real network)
};

// The labeler host (labeler.localhost) and its DID: see labeler.hpp.
struct LabelerOptions {
  // #labels frames (one label each), 0..1,000,000; 0 = no labeler.
  uint64_t labels = 0;
  // Shares of the frames (each 0..1, together at most 1) that negate an earlier label still in
  // force, carry a label that expired long ago, one that expires in 2099, and one signed with
  // another key (which atfill must refuse). The rest are plain labels.
  double negation_share = 0.15;
  double expired_share = 0.1;
  double expiring_share = 0.05;
  double bad_signature_share = 0.05;
  // Frames sent per second per connection; 0 = as fast as the connection takes them.
  double frames_per_second = 0;

  Status Validate() const;
};

struct SimnetOptions {
  // Seed of every generated thing.
  uint64_t seed = 1;
  // Accounts in the network; 1..1,000,000.
  uint32_t accounts = 50;
  // PDS hosts the accounts are spread over; 1..100,000.
  uint32_t pds_hosts = 5;
  // Collections records are drawn from (valid NSIDs).
  std::vector<std::string> collections = {"app.bsky.feed.post", "app.bsky.feed.like"};
  // Records per account (all collections together).
  uint32_t min_records = 0;
  uint32_t max_records = 40;
  RecordCountDistribution distribution = RecordCountDistribution::kLogUniform;
  // Share of accounts that are did:web (each on its own web-NNNN host); 0..1.
  double did_web_share = 0.05;
  // Share of accounts deactivated, and taken down; together at most 1.
  double deactivated_share = 0.02;
  double takendown_share = 0.01;
  // Latency of every response, milliseconds (a timer; no thread sleeps).
  int64_t latency_ms = 0;
  // Listening port on 127.0.0.1; 0 = a free one below 32768 (base/low_port.hpp).
  uint16_t port = 0;
  // Fault rules, in order.
  std::vector<FaultRule> faults;
  // io threads serving requests; 1..64.
  int threads = 2;
  // How long a "timeout" fault holds a request before closing, milliseconds.
  int64_t timeout_hold_ms = 10'000;
  // Text size of an "oversize" record, bytes.
  uint32_t oversize_record_bytes = 2u << 20;
  // Memory for cached repos (records and CAR bytes); beyond it repos are rebuilt on demand.
  uint64_t repo_cache_bytes = uint64_t{200} << 20;
  // The Jetstream host (off unless jetstream.events > 0).
  JetstreamOptions jetstream;
  // The archive host (off unless archive.dir is set).
  ArchiveOptions archive;
  // The labeler (off unless labeler.labels > 0).
  LabelerOptions labeler;

  Status Validate() const;
};

// The engine's account statuses; simnet serves active, deactivated and takendown accounts.
using pipeline::AccountStatus;
using pipeline::AccountStatusName;

struct Account {
  uint32_t index = 0;
  std::string did;
  std::string handle;
  uint32_t pds = 0;  // 0-based PDS index
  int64_t web = -1;  // 0-based did:web host index, or -1 for did:plc
  AccountStatus status = AccountStatus::kActive;
  Bytes key_scalar;                         // the secp256k1 signing key (32 bytes)
  std::string public_key_multibase;         // its public key, as in the DID document
  std::vector<uint32_t> collection_counts;  // records per SimnetOptions::collections entry
  std::string rev;                          // the repo's commit rev (a TID)
  bool bad_signature = false;
  bool private_endpoint = false;
  bool bad_scheme = false;
};

struct GeneratedRecord {
  std::string collection;
  std::string rkey;
  std::string json;  // the record as served in listRecords' `value`
  atproto::Cid cid;  // its real CID
  bool cid_mismatch = false;
  bool oversize = false;
};

// One live record (of an active account), as the servers serve it.
struct TruthRecord {
  std::string uri;
  std::string cid;
  // "" or the faults that concern it, comma-separated: cid_mismatch, oversize, bad_signature
  // (its repo's commit), bad_endpoint (its DID document points nowhere usable).
  std::string faults;
};

struct TruthAccount {
  std::string did;
  std::string pds_url;  // the real PDS, whatever the DID document says
  AccountStatus status = AccountStatus::kActive;
  uint64_t records = 0;
  bool bad_signature = false;
  bool bad_endpoint = false;
};

struct GroundTruth {
  std::vector<TruthAccount> accounts;  // sorted by DID
  std::vector<TruthRecord> records;    // sorted by URI
  // "uri\tcid\n" per record (with a third column of faults, "-" when none, if `with_faults`).
  std::string ToTsv(bool with_faults) const;
};

// The generated network: pure data, no sockets. Const methods are thread-safe.
class Network {
 public:
  // `port` appears in URLs and did:web DIDs.
  static Result<std::unique_ptr<Network>> Generate(const SimnetOptions& options, uint16_t port);

  const SimnetOptions& options() const { return options_; }
  uint16_t port() const { return port_; }
  const std::vector<Account>& accounts() const { return accounts_; }
  // Account indexes sorted by DID (the relay's listing order).
  const std::vector<uint32_t>& by_did() const { return by_did_; }
  const Account* FindDid(std::string_view did) const;

  // Host ids: 0 relay, 1 plc, 2.. PDS hosts, then did:web hosts.
  size_t host_count() const { return host_names_.size(); }
  const std::string& host_name(size_t id) const { return host_names_[id]; }
  // -1 when `name` (lower-case, without the port) is not a simulated host.
  int64_t HostId(std::string_view name) const;
  size_t PdsHostId(uint32_t pds) const { return 2 + pds; }
  const HostFaults& faults(size_t host_id) const { return host_faults_[host_id]; }

  std::string Url(size_t host_id) const;  // "http://<host name>:<port>"
  std::string relay_url() const { return Url(0); }
  std::string plc_url() const { return Url(1); }
  std::string pds_url(uint32_t pds) const { return Url(PdsHostId(pds)); }

  // The account's records, sorted by collection then rkey.
  Result<std::vector<GeneratedRecord>> Records(const Account& account) const;
  // The DID document as JSON.
  std::string DidDocument(const Account& account) const;
  // The key getRepo's commit is signed with (another one under a bad_signature fault).
  Result<atproto::PrivateKey> CommitKey(const Account& account) const;

  Result<GroundTruth> Truth() const;

 private:
  Network() = default;

  SimnetOptions options_;
  uint16_t port_ = 0;
  std::vector<Account> accounts_;
  std::vector<uint32_t> by_did_;
  std::unordered_map<std::string, uint32_t> did_index_;
  std::vector<std::string> host_names_;
  std::unordered_map<std::string, size_t> host_ids_;
  std::vector<HostFaults> host_faults_;
};

// Counters since Start(), per kind of answer.
struct SimnetStats {
  uint64_t connections = 0;
  uint64_t requests = 0;
  uint64_t ok = 0;             // 2xx answers
  uint64_t client_errors = 0;  // 4xx answers other than 429
  uint64_t rate_limited = 0;   // 429 faults
  uint64_t server_errors = 0;  // 5xx faults
  uint64_t timeouts = 0;       // requests held without an answer
  uint64_t truncated = 0;      // bodies cut short
  uint64_t repos_built = 0;    // repos generated (cache misses)
  // Jetstream: WebSocket connections accepted, frames written, connections cut by the
  // disconnect fault, slow consumers dropped.
  uint64_t jetstream_connections = 0;
  uint64_t jetstream_frames = 0;
  uint64_t jetstream_disconnects = 0;
  uint64_t jetstream_slow_drops = 0;
};

class JetstreamLog;
class LabelerLog;
struct JetstreamTruth;

// Where a connection's collections filter took effect: at the connection's first seq, or at the
// seq it had reached when a v1 options_update replaced it.
struct JetstreamFilterStart {
  uint64_t connection = 0;
  int version = 2;
  uint64_t from_seq = 0;                 // the first event the filter applies to
  std::vector<std::string> collections;  // as asked ("prefix.*" for prefixes); empty = all
  bool update = false;                   // a v1 options_update (else a new connection)
};

// The network served on loopback. Start() binds, generates the network and starts the io
// threads; Stop() (also the destructor) closes every connection and joins them. Every method is
// thread-safe.
class Simnet {
 public:
  static Result<std::unique_ptr<Simnet>> Start(SimnetOptions options);
  ~Simnet();
  Simnet(const Simnet&) = delete;
  Simnet& operator=(const Simnet&) = delete;

  uint16_t port() const;
  std::string relay_url() const;  // "http://relay.localhost:PORT"
  std::string plc_url() const;    // "http://plc.localhost:PORT"
  std::string pds_url(uint32_t pds) const;
  // "ws://jetstream.localhost:PORT"; empty when the Jetstream is off.
  std::string jetstream_url() const;
  const Network& network() const;
  // The Jetstream's event log; null when it is off.
  const JetstreamLog* jetstream() const;
  // Where each Jetstream connection's collections filter took effect (empty when it is off).
  std::vector<JetstreamFilterStart> jetstream_filter_starts() const;
  // The trained dictionary of stream version 1 or 2 (empty when the Jetstream is off).
  ByteView jetstream_dictionary(int version) const;
  // The state after applying the log's events 1..through_seq (see JetstreamLog::Truth).
  Result<JetstreamTruth> JetstreamGroundTruth(uint64_t through_seq = UINT64_MAX) const;
  // The ground truth of this instance (did:web DIDs carry its port).
  Result<GroundTruth> Truth() const;
  SimnetStats stats() const;
  // "http://archive.localhost:PORT"; empty when the archive is off.
  std::string archive_url() const;
  // Replaces the archive's faults (their hit counts start again). No-op when it is off.
  void SetArchiveFaults(ArchiveFaults faults);
  ArchiveStats archive_stats() const;
  // "http://labeler.localhost:PORT" and the labeler's log; empty / null when it is off.
  std::string labeler_url() const;
  const LabelerLog* labeler() const;
  // Requests answered (or held) by one host so far.
  uint64_t host_requests(size_t host_id) const;
  // Idempotent.
  void Stop();

 private:
  struct Impl;
  explicit Simnet(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace atfill::simnet
