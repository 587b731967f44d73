// The firehose source's private state, shared by firehose.cpp (Read: framing, keys, resync
// requests) and firehose_work.cpp (Decode and the chain stage, on the engine's workers and its
// ordered node). Not for use outside sources/.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "atproto/crypto.hpp"
#include "net/http_client.hpp"
#include "net/websocket.hpp"
#include "pipeline/chunk.hpp"
#include "pipeline/transform.hpp"
#include "sources/crawl/resolver.hpp"
#include "sources/firehose/firehose.hpp"
#include "sources/firehose/firehose_chain.hpp"
#include "sources/firehose/firehose_frames.hpp"
#include "state/repo_chains.hpp"
#include "state/resolver_cache.hpp"

namespace atfill::sources {

struct FirehoseSource::Impl {
  // What Read knows of an account: its key and its PDS. Shared with the chunks whose frames it
  // verifies, so an #identity that replaces it does not pull it from under a running Decode.
  struct Known {
    atproto::PublicKey key;
    std::string signing_key;  // as the DID document states it
    std::string pds;
  };

  // One input of a chunk, in the order Read took them: a frame to decode and verify, or a resync's
  // getRepo answer to read.
  struct Item {
    FirehoseHead head;                 // a getRepo answer: did only
    bool repo = false;                 // a getRepo answer (bytes: its body)
    std::string bytes;                 // the message, or the answer's body
    std::shared_ptr<const Known> key;  // #commit, #sync and answers: the account's key as of it
    std::optional<pipeline::AccountEvent> account;  // #account: decoded by Read (it tracks them)
  };

  // What Decode made of an item, for the chain stage: each unit's events are the run of the chunk's
  // events with its DID and position (a commit's and an #account's: its seq; a resync's: 0), which
  // the unordered stages between (CID verify, script, account check) may thin but not reorder.
  struct Unit {
    enum class Kind : uint8_t { kCommit, kUnappliable, kSync, kResync, kPass };
    Kind kind = Kind::kPass;
    ChainCommit commit;  // kCommit: the link it makes; else repo, seq (and kSync, kResync: rev;
                         // kResync: data)
  };

  struct Payload : pipeline::ChunkPayload {
    std::vector<Item> items;  // Read -> Decode
    // The collections as Read took the chunk (SetCollections replaces the source's).
    std::shared_ptr<const std::vector<std::string>> collections;
    std::vector<Unit> units;  // Decode -> the chain stage
  };

  // What the WebSocket handlers, the HTTP callbacks and the chain stage hand to Read; shared with
  // the first two, as they may outlive a source being destroyed.
  struct Shared {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<std::string> queue;
    uint64_t queued_bytes = 0;
    bool stopped = true;
    bool reopen = false;  // the buffer overflowed: reconnect once drained
    std::vector<pipeline::EventError> errors;
    std::string host, last_error;
    // Completed resolutions and getRepo answers, and resyncs whose retry is due.
    std::deque<std::pair<std::string, ResolveOutcome>> resolved;
    std::deque<std::pair<std::string, Result<net::HttpResponse>>> repos;
    std::deque<std::string> retries;
    // From the chain stage, in its order: a repo desynchronized (true) or resynced (false).
    std::deque<std::pair<std::string, bool>> chain_news;
    // The newest seq read: the cursor of a reconnection.
    std::atomic<uint64_t> last_seq{0};
    // The last message received, and the last answer that moved the job on (a key resolved, a
    // resync fetched): a quiet run ends idle_exit_ms after the later of them.
    std::atomic<int64_t> last_message_ms{0}, last_progress_ms{0};
    std::atomic<uint64_t> messages{0}, bytes{0}, connections{0}, connection_failures{0};
  };

  // The source's ordered stage: each repo's chain, judged in stream order (FirehoseChain).
  class ChainStage : public pipeline::Transform {
   public:
    explicit ChainStage(Impl* impl) : impl_(impl) {}
    std::string_view name() const override { return "firehose chain"; }
    bool ordered() const override { return true; }
    Status Process(pipeline::TransformState*, pipeline::EventChunk* chunk) const override {
      return impl_->Judge(chunk);
    }

   private:
    Impl* impl_;
  };

  FirehoseOptions options;
  state::KvStore* kv = nullptr;
  std::unique_ptr<net::WebSocketClient> ws;
  std::shared_ptr<Shared> shared = std::make_shared<Shared>();
  // Released in the reverse order: the resolver's callbacks need the cache and the client.
  std::unique_ptr<state::ResolverCache> cache;
  std::unique_ptr<net::HttpClient> http;
  std::unique_ptr<DidResolver> resolver;
  std::unique_ptr<state::RepoChains> chains;
  ChainStage stage{this};

  // The chain is judged by the stage (the ordered node) and released by Committed (the sink
  // thread).
  mutable std::mutex chain_mu;
  std::unique_ptr<FirehoseChain> chain;

  // The collections filter now; `fence`: the first chunk read with it; `committed`: one past the
  // newest durable chunk (WaitFilterApplied).
  mutable std::mutex filter_mu;
  mutable std::condition_variable filter_cv;
  std::shared_ptr<const std::vector<std::string>> collections;
  uint64_t next_chunk = 0, fence = 0, committed = 0;

  // Read's own state (one thread).
  int64_t read_seq = 0;     // the newest seq read
  int64_t cursor_seq = -1;  // the newest resume cursor written
  // The relay's time of the newest frame read (as sent) and of the cursor's frame, unix µs.
  std::string read_time;
  int64_t cursor_time_us = 0;
  std::unordered_map<std::string, std::shared_ptr<const Known>> known;
  std::unordered_map<std::string, std::deque<Item>> waiting;  // for their key, in order
  std::multiset<int64_t> waiting_seqs;
  // What the waiting frames hold (HeldBytes), and the most they held at once.
  uint64_t waiting_bytes = 0;
  std::atomic<uint64_t> peak_waiting_bytes{0};
  bool paused_for_keys = false;
  std::unordered_set<std::string> resolving;
  std::unordered_set<std::string> desynced;  // awaiting a resync (queued, in flight or retrying)
  std::unordered_set<std::string> resync_queued, resync_inflight;
  std::deque<std::string> resync_queue;
  // Desynchronized repos whose account is not active (an #account frame or getRepo said so), with
  // its status: resynced when the account is active again, not before.
  std::unordered_map<std::string, std::string> inactive;
  // Marks of inactive accounts a previous run left for repos no longer desynchronized: cleared
  // with the first chunk.
  std::vector<std::string> stale_inactive;
  bool idle_exit = false;

  mutable std::atomic<uint64_t> verified{0}, refused{0};
  std::atomic<uint64_t> resyncs_started{0};
  std::atomic<uint64_t> desynchronized_now{0}, inactive_now{0};

  // "seq <seq> <did>": the key of a frame's entries in the error log.
  static std::string FrameKey(int64_t seq, std::string_view did) {
    return "seq " + std::to_string(seq) + " " + std::string(did);
  }
  std::string UrlFor(const std::string& host) const;

  Status StartSession();

  std::shared_ptr<const std::vector<std::string>> Collections() const;

  // --- Read: keys and routing ---------------------------------------------------------------

  void Resolve(const std::string& did);

  static bool NeedsKey(const FirehoseHead& h);

  void Refuse(const FirehoseHead& h, const std::string& kind, const std::string& message,
              pipeline::EventChunk* chunk) const;

  // The account of a desynchronized repo is not active: its resync waits, in this run and the
  // next (the mark is written with `chunk`).
  void SetInactive(const std::string& did, std::string status, pipeline::EventChunk* chunk);

  // The account is active again (or moved), or its repo came: its inactive mark goes, and a
  // resync put off for it starts if the repo is still desynchronized.
  void SetActive(const std::string& did, pipeline::EventChunk* chunk);

  // A frame whose account's earlier frames are all taken: into the chunk, or false when it needs
  // a key not known (the caller keeps it waiting and asks for the key).
  bool Handle(Item& item, Payload* payload, pipeline::EventChunk* chunk);

  bool Wanted(std::string_view did) const;

  // The memory a waiting frame holds, roughly.
  static uint64_t HeldBytes(const Item& item);

  void Hold(const std::string& did, Item item);

  void Unhold(const Item& item);

  void Dispatch(Item item, Payload* payload, pipeline::EventChunk* chunk);

  // The account's waiting frames, in order, as far as its key allows.
  void Drain(const std::string& did, Payload* payload, pipeline::EventChunk* chunk);

  void Resolved(const std::string& did, ResolveOutcome outcome, Payload* payload,
                pipeline::EventChunk* chunk);

  // --- Read: resyncs ------------------------------------------------------------------------

  void WantResync(const std::string& did);

  // Thread-safe (Read, and Decode on a worker).
  void RetryLater(const std::string& did) const;

  static void CountResyncFailed(const std::string& did, const std::string& why,
                                pipeline::EventChunk* chunk);

  void ResyncFailed(const std::string& did, const std::string& why, pipeline::EventChunk* chunk);

  void StartResyncs();

  // A getRepo answer: its body goes to Decode (read and verified on a worker); a failure is
  // retried later, an inactive account waits until it is active.
  void RepoAnswered(const std::string& did, Result<net::HttpResponse> r, Payload* payload,
                    pipeline::EventChunk* chunk);

  // --- Decode (workers) ---------------------------------------------------------------------

  void DecodeRepo(Item& item, const std::vector<std::string>& wanted, Payload* payload,
                  pipeline::EventChunk* chunk) const;

  void DecodeFrame(Item& item, const std::vector<std::string>& wanted, Payload* payload,
                   pipeline::EventChunk* chunk) const;

  // --- the chain stage (the ordered node) ----------------------------------------------------

  Status Judge(pipeline::EventChunk* chunk);
};

}  // namespace atfill::sources
