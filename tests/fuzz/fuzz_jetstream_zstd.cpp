// Jetstream zstd messages and dictionaries. Each input is decompressed as the live source does
// (ZstdFrameDecoder without a dictionary, with the v1 dictionary and with the v2 one, both loaded
// from the shared folder at start), and what decompresses is decoded as the frame version that
// dictionary belongs to. An input that starts with the dictionary magic is also loaded as a
// dictionary (getZstdDictionary serves them from the network).
#include <zstd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <string_view>

#include "tests/fuzz/jetstream_checks.hpp"

namespace {

using atfill::fuzz::Check;
using atfill::sources::ZstdDictionary;
using atfill::sources::ZstdFrameDecoder;

// Small enough that a frame claiming more is refused quickly; the engine's default is 32 MiB.
constexpr size_t kMaxOutput = size_t{4} << 20;

struct Decoders {
  std::unique_ptr<ZstdFrameDecoder> none, v1, v2;
};
Decoders* decoders = nullptr;

std::shared_ptr<const ZstdDictionary> LoadShared(const char* relative) {
  auto bytes = atfill::fuzz::ReadSharedFile(relative);
  if (!bytes) {
    std::fprintf(stderr, "fuzz_jetstream_zstd: %s not found under $ATFILL_FUZZ_DATA\n", relative);
    return nullptr;
  }
  auto dict = ZstdDictionary::Load(atfill::AsBytes(*bytes));
  Check(dict.ok(), "the shared dictionaries load");
  return *dict;
}

std::unique_ptr<ZstdFrameDecoder> MakeDecoder(std::shared_ptr<const ZstdDictionary> dict) {
  auto made = ZstdFrameDecoder::Create(std::move(dict), kMaxOutput);
  Check(made.ok(), "a decoder can be made");
  return std::make_unique<ZstdFrameDecoder>(std::move(*made));
}

// Decompresses with `dec`; on success the text is decoded as the live source would.
void Decompress(ZstdFrameDecoder* dec, atfill::ByteView in, bool v1, bool v2) {
  if (dec == nullptr) return;
  std::string out;
  std::string kind;
  const atfill::Status st = dec->Decompress(in, &out, &kind);
  if (!st.ok()) {
    Check(kind == "bad_zstd" || kind == "wrong_dictionary" || kind == "frame_too_large",
          "a decompression error has a documented kind");
    return;
  }
  Check(out.size() <= dec->max_output(), "output within the cap");
  Check(out.capacity() >= out.size() + atfill::sources::kJsonPadding, "output keeps its padding");
  const uint32_t wanted = ZSTD_getDictID_fromFrame(in.data(), in.size());
  const uint32_t have = dec->dictionary() != nullptr ? dec->dictionary()->id() : 0;
  Check(wanted == 0 || wanted == have, "a frame decompresses only with the dictionary it names");
  if (v1) atfill::fuzz::DecodeBothWays(out, /*v2=*/false);
  if (v2) atfill::fuzz::DecodeBothWays(out, /*v2=*/true);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  decoders = new Decoders();
  decoders->none = MakeDecoder(nullptr);
  if (auto v1 = LoadShared("internal/subscribe/dictionaries/legacy_subscribe.zdict")) {
    decoders->v1 = MakeDecoder(std::move(v1));
  }
  if (auto v2 = LoadShared("internal/subscribe/dictionaries/subscribe_events_20260811.zdict")) {
    decoders->v2 = MakeDecoder(std::move(v2));
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const atfill::ByteView in(data, size);
  Decompress(decoders->none.get(), in, /*v1=*/true, /*v2=*/true);
  Decompress(decoders->v1.get(), in, /*v1=*/true, /*v2=*/false);
  Decompress(decoders->v2.get(), in, /*v1=*/false, /*v2=*/true);

  if (size >= 4 && data[0] == 0x37 && data[1] == 0xA4 && data[2] == 0x30 && data[3] == 0xEC) {
    auto dict = ZstdDictionary::Load(in);
    if (dict.ok()) {
      const uint32_t id = static_cast<uint32_t>(data[4]) | static_cast<uint32_t>(data[5]) << 8 |
                          static_cast<uint32_t>(data[6]) << 16 |
                          static_cast<uint32_t>(data[7]) << 24;
      Check((*dict)->id() == id && (*dict)->id() != 0, "a dictionary's ID is its bytes 4..7");
      Check((*dict)->bytes().size() == size, "a dictionary keeps its bytes");
    }
  }
  return 0;
}
