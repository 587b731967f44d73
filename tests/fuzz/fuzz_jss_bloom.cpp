// `.jss` DID bloom filters (the segment's and each block's, read from a fetched footer). Each
// input is parsed as it is and with its trailing CRC-32C recomputed (a mutation almost never
// keeps the CRC right); a filter that parses re-serializes to exactly its bytes.
#include <boost/crc.hpp>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "sources/archive/jss_bloom.hpp"
#include "tests/fuzz/fuzz_util.hpp"

namespace {

namespace jss = atfill::jss;
using atfill::fuzz::Check;

void ParseAndCheck(const std::string& bytes) {
  auto bloom = jss::Bloom::Parse(atfill::AsBytes(bytes));
  if (!bloom.ok()) return;
  Check(bloom->Serialize() == bytes, "a bloom re-serializes to its bytes");
  Check(bloom->serialized_size() == bytes.size(), "a bloom states its size");
  for (const char* did : {"did:plc:abcdefghijklmnopqrstuvwx", "did:web:example.com"}) {
    (void)bloom->MayContain(did);
  }
  jss::Bloom copy = *bloom;
  copy.Add("did:plc:abcdefghijklmnopqrstuvwx");
  Check(copy.MayContain("did:plc:abcdefghijklmnopqrstuvwx"), "an added DID is found");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string bytes(reinterpret_cast<const char*>(data), size);
  ParseAndCheck(bytes);
  if (size < jss::Bloom::kOverheadBytes) return 0;
  boost::crc_optimal<32, 0x1EDC6F41, 0xFFFFFFFF, 0xFFFFFFFF, true, true> crc;
  crc.process_bytes(data, size - 4);
  const uint32_t sum = crc.checksum();
  std::memcpy(bytes.data() + size - 4, &sum, sizeof(sum));
  ParseAndCheck(bytes);
  return 0;
}
