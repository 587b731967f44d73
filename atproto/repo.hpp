// atproto repositories as CAR files (com.atproto.sync.getRepo): a signed commit (the CAR root)
// {did, version: 3, data: MST root link, rev: TID, prev: link|null, sig: bytes}, the MST nodes
// and the record blocks. RepoReader reads one and walks its records; RepoWriter makes one.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "atproto/car.hpp"
#include "atproto/cid.hpp"
#include "atproto/crypto.hpp"
#include "atproto/value.hpp"
#include "base/bytes.hpp"
#include "base/status.hpp"

namespace atfill::atproto {

struct Commit {
  std::string did;
  int64_t version = 3;
  Cid data;                 // MST root
  std::string rev;          // TID; may be empty only in version 2 commits
  std::optional<Cid> prev;  // usually null in version 3
  Bytes sig;                // 64-byte r||s signature of the unsigned commit
};

// Decodes a signed commit block and checks its fields: did a "did:" string, version 3 (or 2),
// data a link, rev a TID (version 3), prev a link or null (or absent), sig bytes. When
// `unsigned_bytes` is set it receives the DAG-CBOR of the commit map without `sig` (unknown extra
// fields kept): the bytes the signature covers.
Result<Commit> DecodeCommit(ByteView block, Bytes* unsigned_bytes = nullptr);

// DAG-CBOR of the commit without `sig` (the bytes to sign) and with it (the commit block).
Bytes EncodeUnsignedCommit(const Commit& commit);
Bytes EncodeSignedCommit(const Commit& commit);

// Signs the commit with `key`, storing the signature in commit->sig. Returns the commit block.
Result<Bytes> SignCommit(Commit* commit, const PrivateKey& key);

// One record of a repository. Views stay valid as long as the RepoReader (or its buffer) lives.
struct RepoRecord {
  std::string_view collection;
  std::string_view rkey;
  Cid cid;
  ByteView cbor;  // the record block, a view into the CAR

  // The record as atproto JSON (DecodeCbor + ValueToJson).
  Result<std::string> ToJson() const;
};

// A record that could not be handed out; the walk went on without it.
struct RecordError {
  std::string path;  // "collection/rkey"
  Cid cid;
  Status status;
};

struct RepoReadOptions {
  CarLimits car;
  // Largest file OpenFile reads, in bytes.
  uint64_t max_file_bytes = uint64_t{4} << 30;
  // Decode every record (strict DAG-CBOR, a map with a string $type) before handing it out; a
  // failure is a RecordError.
  bool validate_records = false;
};

// Reads a repository CAR: verifies every block's hash against its CID, decodes the commit (the
// first root) and walks the MST. Holds views into the CAR bytes, no copies. Const methods are
// thread-safe; movable.
class RepoReader {
 public:
  // `car` must outlive the reader.
  static Result<RepoReader> Open(ByteView car, const RepoReadOptions& options = {});
  // Takes ownership of the bytes.
  static Result<RepoReader> Open(Bytes car, const RepoReadOptions& options = {});
  // Reads the file once into memory.
  static Result<RepoReader> OpenFile(const std::filesystem::path& path,
                                     const RepoReadOptions& options = {});

  const Commit& commit() const { return commit_; }
  const Cid& commit_cid() const { return commit_cid_; }
  // The bytes the commit signature covers.
  ByteView unsigned_commit() const { return unsigned_commit_; }
  const BlockStore& blocks() const { return blocks_; }
  // Sections in the CAR (duplicates included).
  size_t section_count() const { return sections_; }

  // OK when the commit signature verifies with `key`; Invalid otherwise.
  Status VerifySignature(const PublicKey& key) const;

  using RecordFn = std::function<Status(const RepoRecord&)>;
  // Calls `fn` for every record in key order (collection, then rkey). A record whose block is
  // missing (or, with validate_records, does not decode) is appended to *record_errors and
  // skipped; when record_errors is null it ends the walk with that error instead. A broken MST
  // (missing or malformed node) ends the walk with its error; records before it were delivered.
  // A non-OK Status from `fn` ends the walk and is returned.
  Status ForEachRecord(const RecordFn& fn, std::vector<RecordError>* record_errors) const;

  RepoReader(RepoReader&&) noexcept = default;
  RepoReader& operator=(RepoReader&&) noexcept = default;
  RepoReader(const RepoReader&) = delete;
  RepoReader& operator=(const RepoReader&) = delete;

 private:
  RepoReader() = default;
  static Result<RepoReader> Parse(RepoReader reader, ByteView car, const RepoReadOptions& options);

  Bytes owned_;  // the CAR when the reader owns it (a moved vector keeps its buffer)
  RepoReadOptions options_;
  BlockStore blocks_;
  size_t sections_ = 0;
  Cid commit_cid_;
  Commit commit_;
  Bytes unsigned_commit_;
};

// The repository a RepoWriter made.
struct WrittenRepo {
  Cid commit_cid;
  Commit commit;
  Bytes car;  // commit block first, then MST nodes (parents first), then records in key order
};

// Builds a repository from records: record blocks, the MST, a signed commit and a CAR. Not
// thread-safe.
class RepoWriter {
 public:
  // Adds or replaces the record at collection/rkey (a valid MST key). The record must be a map
  // with a non-empty string $type. Returns the record's CID.
  Result<Cid> Put(std::string_view collection, std::string_view rkey, const Value& record);
  // As Put, from atproto JSON.
  Result<Cid> PutJson(std::string_view collection, std::string_view rkey, std::string_view json);
  // Removes a record; NotFound when absent.
  Status Delete(std::string_view collection, std::string_view rkey);

  size_t size() const { return records_.size(); }

  // Makes version 3 commit {did, data, rev, prev}, signs it with `key`, and writes the CAR.
  // `rev` must be a TID.
  Result<WrittenRepo> Write(std::string_view did, std::string_view rev, const PrivateKey& key,
                            std::optional<Cid> prev = std::nullopt) const;

 private:
  struct Stored {
    Cid cid;
    Bytes cbor;
  };
  Result<Cid> PutCbor(std::string_view collection, std::string_view rkey, Bytes cbor);

  std::map<std::string, Stored> records_;  // by MST key, so in key order
};

}  // namespace atfill::atproto
