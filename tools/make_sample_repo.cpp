// Writes examples/data/sample.car: the repository the demo and tests read, from
// examples/data/sample_repo.jsonl ({"collection","rkey","record"} per line), signed with a fixed
// secp256k1 key derived from a public phrase (a sample, not a secret). Prints the key's did:key.
//
//   build/make-sample-repo examples/data/sample_repo.jsonl examples/data/sample.car
#include <simdjson.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "atproto/repo.hpp"
#include "base/sha256.hpp"

namespace {

constexpr std::string_view kDid = "did:plc:atfillsampleaaaaaaaaaaaa";
constexpr std::string_view kRev = "3lbqzbaaaaa2a";
constexpr std::string_view kKeyPhrase = "atfill sample repository signing key";

int Fail(const std::string& msg) {
  std::fprintf(stderr, "make-sample-repo: %s\n", msg.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace atfill;
  if (argc != 3) return Fail("usage: make-sample-repo RECORDS.jsonl OUT.car");
  const Sha256Digest scalar = Sha256(AsBytes(kKeyPhrase));
  auto key = atproto::PrivateKey::FromBytes(atproto::KeyType::kSecp256k1, scalar);
  if (!key.ok()) return Fail(key.status().ToString());

  std::ifstream in(argv[1]);
  if (!in) return Fail(std::string("cannot open ") + argv[1]);
  atproto::RepoWriter writer;
  simdjson::dom::parser parser;
  std::string line;
  size_t line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (line.empty()) continue;
    simdjson::dom::element doc;
    std::string_view collection, rkey;
    simdjson::dom::element record;
    if (parser.parse(line).get(doc) || doc["collection"].get(collection) || doc["rkey"].get(rkey) ||
        doc["record"].get(record)) {
      return Fail("line " + std::to_string(line_no) + ": needs collection, rkey and record");
    }
    auto cid = writer.PutJson(collection, rkey, simdjson::minify(record));
    if (!cid.ok()) return Fail("line " + std::to_string(line_no) + ": " + cid.status().ToString());
  }
  auto repo = writer.Write(kDid, kRev, *key);
  if (!repo.ok()) return Fail(repo.status().ToString());
  std::ofstream out(argv[2], std::ios::binary);
  out.write(reinterpret_cast<const char*>(repo->car.data()),
            static_cast<std::streamsize>(repo->car.size()));
  if (!out) return Fail(std::string("cannot write ") + argv[2]);
  std::printf("%s\n", key->public_key().ToDidKey().c_str());
  return 0;
}
