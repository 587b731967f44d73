// The live source: a Jetstream consumer. Speaks v2 network.bsky.jetstream.subscribeEvents (seq
// cursor, kinds/dids/collections filters, zstd with the host's dictionary) and falls back to v1
// /subscribe (cursor in time_us, wantedCollections/wantedDids, zstd with a configured dictionary
// file) when the host answers the v2 upgrade with 404; reconnects with jittered backoff and fails
// over along the configured hosts (net/websocket.hpp).
//
// Delivery: Read hands the messages received so far to the engine as one chunk; Decode
// (parallel) decompresses and decodes them into events and sets the chunk's resume cursor to the
// last seq it holds. Chunks commit in order, so the saved cursor is the applied watermark: every
// event below it is durable in the sink. A restart resumes from it (v2: seq, inclusive, so the
// last event is delivered again; the sink's idempotent writes make that exact). The cursor also
// keeps the witnessed (display) time of that event: when a v2 host refuses the seq as too old
// (CursorTooOld) or the consumer moves to a v1 host, the time is the cursor.
//
// Threading: the WebSocket loop thread only appends messages to a queue Read drains (waiting at
// most tick_ms, then returning a tick chunk so batches flush on time). When the queue holds more
// than max_buffered_bytes the connection is closed and opened again from the last seq seen, so a
// slow sink never loses events and memory stays bounded.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "base/status.hpp"
#include "net/websocket.hpp"
#include "pipeline/source.hpp"
#include "sources/jetstream/jetstream_frames.hpp"
#include "state/kv_store.hpp"

namespace atfill::sources {

enum class JetstreamProtocol : uint8_t { kAuto, kV2, kV1 };
std::string_view JetstreamProtocolName(JetstreamProtocol p);
Result<JetstreamProtocol> ParseJetstreamProtocol(std::string_view text);  // auto | v2 | v1

struct JetstreamOptions {
  // Jetstream hosts, tried in order (failover): "wss://jetstream1.us-east.bsky.network" or
  // "ws://jetstream.localhost:PORT". At least one. They are the operator's, so they are reached
  // wherever they point: loopback and private addresses included.
  std::vector<std::string> hosts;
  // auto: v2 first, v1 after a 404 on the v2 endpoint (until the process restarts).
  JetstreamProtocol protocol = JetstreamProtocol::kAuto;
  // Commit collections wanted (NSIDs or "prefix.*"); empty = all.
  std::vector<std::string> collections;
  // Accounts wanted; empty = all.
  std::vector<std::string> dids;
  // Where a consumer without a saved cursor starts: 0 = the live tip (events from now on), else
  // this seq (v2) or, on v1, the beginning of what the host keeps.
  uint64_t start_seq = 0;
  // v2: ask for zstd with the host's dictionary (fetched once and kept in state).
  bool compress = true;
  // v1: a zstd dictionary file; compression is off on v1 when empty.
  std::string v1_dictionary_path;
  // Largest message accepted (decompressed frames are capped at the same size).
  uint64_t max_message_bytes = uint64_t{32} << 20;
  // Messages received and not yet handed to the engine, in bytes, before the connection is
  // dropped and resumed later from the cursor.
  uint64_t max_buffered_bytes = uint64_t{256} << 20;
  // Messages per chunk at most.
  uint32_t chunk_messages = 1024;
  // How long Read waits for a message before it returns a tick chunk, milliseconds.
  int64_t tick_ms = 50;
  // End the input (Read returns false; the job pauses with reason stream_idle) after this long
  // without a message, milliseconds; 0 = never (a live consumer runs until it is paused). For
  // tests and benchmarks.
  int64_t idle_exit_ms = 0;
  // Reconnect backoff and failover, timeouts, ping handling.
  net::WebSocketOptions websocket;
  // Gap replay (v2): when the host answers CursorTooOld, called with the last seq received and the
  // host (ws:// or wss:// URL) that refused it, on the
  // connection's thread (it may take up to its own deadline, about 30 s). It arranges for the
  // gap to be replayed from the host's archive (a replay job) and returns the seq the stream
  // resumes after (the archive's sealed tip) and the job's id; the stream then resumes at that
  // seq and the gap is logged naming the job. An error (or no callback) resumes by witnessed
  // time from the host's floor, as before, and the log says a backfill is the way to recover.
  struct GapReplay {
    uint64_t resume_after_seq = 0;
    uint64_t job_id = 0;
  };
  std::function<Result<GapReplay>(uint64_t last_seq, const std::string& host)> gap_replay;

  Status Validate() const;
};

struct JetstreamStats {
  uint64_t messages = 0;        // received
  uint64_t bytes = 0;           // received (as sent: compressed or not)
  uint64_t connections = 0;     // upgrades that succeeded
  uint64_t reconnects = 0;      // connections after the first
  uint64_t v1_fallbacks = 0;    // 404 on v2 answered by moving to v1
  uint64_t gap_replays = 0;     // CursorTooOld answered by a replay job for the gap
  uint64_t overflow_drops = 0;  // connections dropped because the buffer was full
  uint64_t cursor_too_old = 0;  // v2 refusals of a seq cursor (resumed by time)
  // Connections whose first event was past the position they resumed from (the host no longer
  // had it): each is logged (error kind stream_gap) and counted (job counter stream_gaps); on v2
  // the events skipped are counted too (v1 has no seq: its log line gives the time span).
  uint64_t gaps = 0;
  uint64_t gap_events = 0;
  // v2 hosts that numbered their events anew (our seq cursor past their tip): each is logged
  // (error kind future_cursor, job counter future_cursors) and resumed by witnessed time.
  uint64_t future_cursors = 0;
  // Attempts that ended (connected or not), and those that ended badly: refused, failed to
  // connect, dropped, or closed by the host with a code other than 1000. Each bad end is an entry
  // of the job's error log (kinds connection_refused, connection_failed, connection_lost,
  // connection_closed; key: the host) and adds 1 to the job counter live_connection_failures.
  uint64_t attempts = 0;
  uint64_t connection_failures = 0;
  std::string last_error;       // "<kind>: <reason>" of the latest bad end, or ""
  std::string protocol;         // "v2" or "v1", now
  std::string host;             // the host connected to (or last tried)
  uint64_t last_seq = 0;        // the newest seq decoded
  int64_t last_time_us = 0;     // and its witnessed time
  uint64_t buffered_bytes = 0;  // waiting for Read
  // SetCollections calls, and where the newest took effect: on v2 the seq the stream reconnected
  // at (the first event the new filter applies to; 0 until that connection is asked for), on v1
  // the newest seq received when the options_update was sent.
  uint64_t filter_changes = 0;
  uint64_t filter_from_seq = 0;
};

class JetstreamSource : public pipeline::Source {
 public:
  // `kv` keeps the v2 dictionary (and must outlive the source). Starts the WebSocket client; the
  // connection opens at Seek.
  static Result<std::unique_ptr<JetstreamSource>> Create(JetstreamOptions options,
                                                         state::KvStore* kv);
  ~JetstreamSource() override;

  // `resume_cursor`: "" (live tip) or "<seq>:<time_us>:<host>" as Decode writes it (the seq is
  // in that host's numbering; on another host the consumer resumes by witnessed time).
  Status Seek(const std::string& resume_cursor) override;
  Result<bool> Read(pipeline::EventChunk* chunk) override;
  void Decode(pipeline::EventChunk* chunk) const override;
  // Decode's first half: calls on_frame with every frame of the chunk (decompressed and decoded;
  // bad ones go to chunk->errors) and moves the cursor, leaving chunk->events alone. For callers
  // that keep the frames themselves (atfill archive write from a live host).
  void DecodeFrames(pipeline::EventChunk* chunk,
                    const std::function<void(JetstreamFrame& frame)>& on_frame) const;
  std::string Describe() const override;
  // After an idle exit (idle_exit_ms): "stream_idle", so the job pauses (a live job does not
  // complete) and the next run continues from its cursor.
  state::StopReason Unfinished() const override;

  JetstreamStats stats() const;

  // The collections to consume from now on (JetstreamOptions::collections' rules; not empty:
  // an empty filter would take every collection), without losing the stream's place: on v1 an
  // options_update message replaces the filter of the open connection (a connection opened later
  // asks for the new one in its URL), on v2 the connection is closed and opened again at the
  // newest seq decoded with the new collections[] (the events in between come again; the sink's
  // writes are idempotent). Events already received are still applied. Thread-safe.
  // Record events of other collections in chunks read from then on are dropped as they are
  // decoded (counter live_unwanted); chunks read before the change are decoded with the filter
  // they were received under, even when the parallel Decode reaches them later, so a removed
  // collection's rows end at one point of the stream, with no hole before it.
  Status SetCollections(std::vector<std::string> collections);
  std::vector<std::string> collections() const;
  // Whether the filter now takes `collection`.
  bool Consumes(std::string_view collection) const;
  // Waits at most `timeout` until every chunk read before the last SetCollections is committed:
  // from then on nothing of a removed collection reaches the sink (Unavailable otherwise).
  Status WaitFilterApplied(std::chrono::milliseconds timeout) const;
  void Committed(uint64_t through_seq) override;

 private:
  struct Impl;
  explicit JetstreamSource(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace atfill::sources
