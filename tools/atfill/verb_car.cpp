#include <cstdio>
#include <optional>
#include <string>
#include <string_view>

#include "atproto/repo.hpp"
#include "tools/atfill/args.hpp"
#include "tools/atfill/cli.hpp"

namespace atfill::cli {

int RunCar(std::span<char* const> args) {
  std::optional<std::string> path;
  std::optional<std::string> key_text;
  CLI::App app{"", "atfill car"};
  PrepareVerbApp(app);
  app.add_option("FILE", path, "the CAR file (one)")->required();
  app.add_option("--key", key_text, "the did:key that signed the commit");
  if (auto rc = ParseVerbArgs(app, args)) return *rc;
  std::optional<atproto::PublicKey> key;
  if (key_text) {
    auto parsed = atproto::PublicKey::FromDidKey(*key_text);
    if (!parsed.ok()) {
      std::fprintf(stderr, "atfill car: --key %s: %s\n", key_text->c_str(),
                   parsed.status().message().c_str());
      return kExitUsage;
    }
    key = std::move(*parsed);
  }

  auto reader = atproto::RepoReader::OpenFile(*path);
  if (!reader.ok()) {
    std::fprintf(stderr, "error: %s: %s\n", path->c_str(), reader.status().message().c_str());
    return reader.status().code() == StatusCode::kIoError ? kExitIo : kExitInputInvalid;
  }
  const atproto::Commit& commit = reader->commit();
  if (key) {
    if (Status s = reader->VerifySignature(*key); !s.ok()) {
      std::fprintf(stderr, "error: %s: commit signature: %s\n", path->c_str(), s.message().c_str());
      return kExitInputInvalid;
    }
  }

  std::vector<atproto::RecordError> record_errors;
  std::string line;
  size_t records = 0;
  const Status walked = reader->ForEachRecord(
      [&](const atproto::RepoRecord& r) -> Status {
        auto json = r.ToJson();
        if (!json.ok()) {
          record_errors.push_back(
              {std::string(r.collection) + "/" + std::string(r.rkey), r.cid, json.status()});
          return Status::OK();
        }
        // DIDs, NSIDs and record keys hold no characters JSON needs escaped.
        line = "{\"uri\":\"at://" + commit.did + "/" + std::string(r.collection) + "/" +
               std::string(r.rkey) + "\",\"cid\":\"" + r.cid.ToString() + "\",\"record\":" + *json +
               "}\n";
        std::fwrite(line.data(), 1, line.size(), stdout);
        ++records;
        return Status::OK();
      },
      &record_errors);
  std::fflush(stdout);
  for (const auto& e : record_errors) {
    std::fprintf(stderr, "error: %s: record %s (%s): %s\n", path->c_str(), e.path.c_str(),
                 e.cid.ToString().c_str(), e.status.message().c_str());
  }
  if (!walked.ok()) {
    std::fprintf(stderr, "error: %s: %s\n", path->c_str(), walked.message().c_str());
    return kExitInputInvalid;
  }
  std::fprintf(stderr, "%s: %zu records, repo %s rev %s, commit %s%s\n", path->c_str(), records,
               commit.did.c_str(), commit.rev.c_str(), reader->commit_cid().ToString().c_str(),
               key ? ", signature verified" : "");
  return record_errors.empty() ? kExitOk : kExitInputInvalid;
}

}  // namespace atfill::cli
