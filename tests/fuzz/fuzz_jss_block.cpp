// `.jss` block frames as getBlock serves them (one zstd frame of a columnar block body), and the
// columnar body itself: the zstd layer checks almost every mutated frame away, so each input is
// also parsed as a body. A parsed body must be canonical (jss_checks.hpp).
#include <cstddef>
#include <cstdint>
#include <string>

#include "sources/archive/jss.hpp"
#include "tests/fuzz/jss_checks.hpp"

namespace {

namespace jss = atfill::jss;
using atfill::fuzz::Check;

constexpr uint64_t kCap = uint64_t{8} << 20;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const atfill::ByteView in(data, size);
  // As the replay source reads a fetched block: the size is unknown, then as the index states it.
  auto body = jss::DecompressFrame(in, 0, kCap);
  if (body.ok()) {
    Check(body->size() <= kCap, "a body is within the cap");
    auto sized = jss::DecompressFrame(in, static_cast<uint32_t>(body->size()), kCap);
    Check(body->empty() || (sized.ok() && *sized == *body),
          "a frame decompresses alike with its size known");
    if (auto block = jss::Block::Parse(std::move(*body)); block.ok()) {
      atfill::fuzz::CheckBlock(*block);
    }
  }
  if (auto block = jss::Block::Parse(std::string(reinterpret_cast<const char*>(data), size));
      block.ok()) {
    atfill::fuzz::CheckBlock(*block);
  }
  return 0;
}
