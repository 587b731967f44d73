#include "atproto/repo.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <unordered_set>
#include <utility>

#include "atproto/cbor.hpp"
#include "atproto/json.hpp"
#include "atproto/mst.hpp"
#include "atproto/syntax.hpp"
#include "atproto/tid.hpp"

namespace atfill::atproto {
namespace {

Value CommitToValue(const Commit& commit, bool with_sig) {
  Value::Map map;
  map.emplace_back("did", Value::String(commit.did));
  map.emplace_back("rev", Value::String(commit.rev));
  if (with_sig) map.emplace_back("sig", Value::BytesValue(commit.sig));
  map.emplace_back("data", Value::Link(commit.data));
  map.emplace_back("prev", commit.prev ? Value::Link(*commit.prev) : Value::Null());
  map.emplace_back("version", Value::Int(commit.version));
  return Value::MakeMap(std::move(map));
}

Status CheckRecordValue(const Value& record) {
  if (record.kind() != Value::Kind::kMap) return Status::Invalid("record is not a map");
  const Value* type = record.Find("$type");
  if (type == nullptr || type->kind() != Value::Kind::kString || type->as_string().empty()) {
    return Status::Invalid("record has no non-empty string $type");
  }
  return Status::OK();
}

Result<Bytes> ReadWholeFile(const std::filesystem::path& path, uint64_t max_bytes) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::IoError("cannot open " + path.string() + ": " + std::strerror(errno));
  struct FdCloser {
    int fd;
    ~FdCloser() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    return Status::IoError("cannot stat " + path.string() + ": " + std::strerror(errno));
  }
  if (static_cast<uint64_t>(st.st_size) > max_bytes) {
    return Status::OutOfRange(path.string() + " has " + std::to_string(st.st_size) +
                              " bytes, more than the limit of " + std::to_string(max_bytes));
  }
  Bytes data(static_cast<size_t>(st.st_size));
  size_t got = 0;
  while (got < data.size()) {
    const ssize_t n = ::read(fd, data.data() + got, data.size() - got);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::IoError("cannot read " + path.string() + ": " + std::strerror(errno));
    }
    if (n == 0) break;  // the file shrank; parse what is there
    got += static_cast<size_t>(n);
  }
  data.resize(got);
  return data;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Commit

Result<Commit> DecodeCommit(ByteView block, Bytes* unsigned_bytes) {
  ATFILL_ASSIGN_OR_RETURN(Value value, DecodeCbor(block));
  if (value.kind() != Value::Kind::kMap) return Status::Invalid("commit is not a map");
  Commit commit;

  const Value* version = value.Find("version");
  if (version == nullptr || version->kind() != Value::Kind::kInt) {
    return Status::Invalid("commit has no integer version");
  }
  commit.version = version->as_int();
  if (commit.version != 3 && commit.version != 2) {
    return Status::Unsupported("commit version " + std::to_string(commit.version) +
                               " (expected 3 or 2)");
  }

  const Value* did = value.Find("did");
  if (did == nullptr || did->kind() != Value::Kind::kString) {
    return Status::Invalid("commit has no string did");
  }
  ATFILL_RETURN_IF_ERROR(ValidateDid(did->as_string()).WithContext("commit did"));
  commit.did = did->as_string();

  const Value* data = value.Find("data");
  if (data == nullptr || data->kind() != Value::Kind::kLink) {
    return Status::Invalid("commit has no data link");
  }
  commit.data = data->as_link();

  const Value* rev = value.Find("rev");
  if (rev != nullptr) {
    if (rev->kind() != Value::Kind::kString) return Status::Invalid("commit rev is not a string");
    ATFILL_RETURN_IF_ERROR(ValidateTid(rev->as_string()).WithContext("commit rev"));
    commit.rev = rev->as_string();
  } else if (commit.version == 3) {
    return Status::Invalid("version 3 commit has no rev");
  }

  const Value* prev = value.Find("prev");
  if (prev != nullptr && !prev->is_null()) {
    if (prev->kind() != Value::Kind::kLink) {
      return Status::Invalid("commit prev is neither a link nor null");
    }
    commit.prev = prev->as_link();
  }

  const Value* sig = value.Find("sig");
  if (sig == nullptr || sig->kind() != Value::Kind::kBytes) {
    return Status::Invalid("commit has no sig bytes");
  }
  commit.sig = sig->as_bytes();

  if (unsigned_bytes != nullptr) {
    // The decoder only accepts canonical DAG-CBOR, so re-encoding the map without `sig` gives the
    // exact bytes that were signed, unknown fields included.
    Value::Map& map = value.as_map();
    std::erase_if(map, [](const auto& entry) { return entry.first == "sig"; });
    unsigned_bytes->clear();
    EncodeCbor(value, unsigned_bytes);
  }
  return commit;
}

Bytes EncodeUnsignedCommit(const Commit& commit) {
  return EncodeCbor(CommitToValue(commit, /*with_sig=*/false));
}

Bytes EncodeSignedCommit(const Commit& commit) {
  return EncodeCbor(CommitToValue(commit, /*with_sig=*/true));
}

Result<Bytes> SignCommit(Commit* commit, const PrivateKey& key) {
  ATFILL_ASSIGN_OR_RETURN(commit->sig, key.Sign(EncodeUnsignedCommit(*commit)));
  return EncodeSignedCommit(*commit);
}

// ---------------------------------------------------------------------------------------------
// RepoRecord

Result<std::string> RepoRecord::ToJson() const {
  auto value = DecodeCbor(cbor);
  if (!value.ok()) {
    return value.status().WithContext("record " + std::string(collection) + "/" +
                                      std::string(rkey));
  }
  return ValueToJson(*value);
}

// ---------------------------------------------------------------------------------------------
// RepoReader

Result<RepoReader> RepoReader::Open(ByteView car, const RepoReadOptions& options) {
  return Parse(RepoReader(), car, options);
}

Result<RepoReader> RepoReader::Open(Bytes car, const RepoReadOptions& options) {
  RepoReader reader;
  reader.owned_ = std::move(car);
  const ByteView view(reader.owned_);
  return Parse(std::move(reader), view, options);
}

Result<RepoReader> RepoReader::OpenFile(const std::filesystem::path& path,
                                        const RepoReadOptions& options) {
  ATFILL_ASSIGN_OR_RETURN(Bytes data, ReadWholeFile(path, options.max_file_bytes));
  auto reader = Open(std::move(data), options);
  if (!reader.ok()) return reader.status().WithContext(path.string());
  return reader;
}

Result<RepoReader> RepoReader::Parse(RepoReader reader, ByteView car,
                                     const RepoReadOptions& options) {
  reader.options_ = options;
  ATFILL_ASSIGN_OR_RETURN(CarReader car_reader, CarReader::Open(car, options.car));
  if (car_reader.roots().empty()) return Status::Invalid("repo CAR has no root (commit) CID");
  reader.commit_cid_ = car_reader.roots().front();
  ATFILL_ASSIGN_OR_RETURN(reader.sections_, LoadCarBlocks(&car_reader, &reader.blocks_));
  const std::optional<ByteView> commit_block = reader.blocks_.Get(reader.commit_cid_);
  if (!commit_block) {
    return Status::NotFound("repo CAR lacks its commit block " + reader.commit_cid_.ToString());
  }
  auto commit = DecodeCommit(*commit_block, &reader.unsigned_commit_);
  if (!commit.ok()) return commit.status().WithContext("commit " + reader.commit_cid_.ToString());
  reader.commit_ = std::move(commit).value();
  return reader;
}

Status RepoReader::VerifySignature(const PublicKey& key) const {
  Status st = key.Verify(unsigned_commit_, commit_.sig);
  if (st.ok()) return st;
  return Status::Invalid("commit " + commit_cid_.ToString() + " of " + commit_.did +
                         ": signature does not verify: " + st.message());
}

Status RepoReader::ForEachRecord(const RecordFn& fn,
                                 std::vector<RecordError>* record_errors) const {
  auto visit = [&](std::string_view key, const Cid& cid) -> Status {
    const size_t slash = key.find('/');  // WalkMst checked the key shape
    RepoRecord record;
    record.collection = key.substr(0, slash);
    record.rkey = key.substr(slash + 1);
    record.cid = cid;
    Status problem;
    const std::optional<ByteView> block = blocks_.Get(cid);
    if (!block) {
      problem = Status::NotFound("record block " + cid.ToString() + " for " + std::string(key) +
                                 " is missing from the CAR");
    } else if (options_.validate_records) {
      auto value = DecodeCbor(*block);
      problem = value.ok() ? CheckRecordValue(*value) : value.status();
      if (!problem.ok()) problem = problem.WithContext("record " + std::string(key));
    }
    if (!problem.ok()) {
      if (record_errors == nullptr) return problem;
      record_errors->push_back({std::string(key), cid, std::move(problem)});
      return Status::OK();
    }
    record.cbor = *block;
    return fn(record);
  };
  return WalkMst(blocks_, commit_.data, visit);
}

// ---------------------------------------------------------------------------------------------
// RepoWriter

Result<Cid> RepoWriter::PutCbor(std::string_view collection, std::string_view rkey, Bytes cbor) {
  ATFILL_RETURN_IF_ERROR(ValidateNsid(collection).WithContext("collection"));
  ATFILL_RETURN_IF_ERROR(ValidateRecordKey(rkey).WithContext("rkey"));
  std::string key;
  key.reserve(collection.size() + 1 + rkey.size());
  key.append(collection).append("/").append(rkey);
  ATFILL_RETURN_IF_ERROR(ValidateMstKey(key));
  const Cid cid = Cid::Compute(Cid::Codec::kDagCbor, cbor);
  records_.insert_or_assign(std::move(key), Stored{cid, std::move(cbor)});
  return cid;
}

Result<Cid> RepoWriter::Put(std::string_view collection, std::string_view rkey,
                            const Value& record) {
  ATFILL_RETURN_IF_ERROR(CheckRecordValue(record));
  return PutCbor(collection, rkey, EncodeCbor(record));
}

Result<Cid> RepoWriter::PutJson(std::string_view collection, std::string_view rkey,
                                std::string_view json) {
  ATFILL_ASSIGN_OR_RETURN(Value record, JsonToValue(json));
  return Put(collection, rkey, record);
}

Status RepoWriter::Delete(std::string_view collection, std::string_view rkey) {
  std::string key;
  key.append(collection).append("/").append(rkey);
  if (records_.erase(key) == 0) return Status::NotFound("no record at " + key);
  return Status::OK();
}

Result<WrittenRepo> RepoWriter::Write(std::string_view did, std::string_view rev,
                                      const PrivateKey& key, std::optional<Cid> prev) const {
  ATFILL_RETURN_IF_ERROR(ValidateDid(did).WithContext("repo did"));
  ATFILL_RETURN_IF_ERROR(ValidateTid(rev).WithContext("repo rev"));

  std::vector<MstEntry> entries;
  entries.reserve(records_.size());
  for (const auto& [path, stored] : records_) entries.push_back({path, stored.cid});
  std::vector<std::pair<Cid, Bytes>> nodes;
  ATFILL_ASSIGN_OR_RETURN(Cid data, BuildMst(entries, &nodes));

  WrittenRepo out;
  out.commit.did = std::string(did);
  out.commit.version = 3;
  out.commit.data = data;
  out.commit.rev = std::string(rev);
  out.commit.prev = prev;
  ATFILL_ASSIGN_OR_RETURN(Bytes commit_block, SignCommit(&out.commit, key));
  out.commit_cid = Cid::Compute(Cid::Codec::kDagCbor, commit_block);

  const Cid roots[] = {out.commit_cid};
  CarWriter car(roots);
  ATFILL_RETURN_IF_ERROR(car.Add(out.commit_cid, commit_block));
  for (const auto& [cid, bytes] : nodes) ATFILL_RETURN_IF_ERROR(car.Add(cid, bytes));
  std::unordered_set<Cid> written;  // identical records share one block
  for (const auto& [path, stored] : records_) {
    if (!written.insert(stored.cid).second) continue;
    ATFILL_RETURN_IF_ERROR(car.Add(stored.cid, stored.cbor));
  }
  out.car = car.TakeBytes();
  return out;
}

}  // namespace atfill::atproto
