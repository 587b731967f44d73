// CAR and repository reading: never crashes, never allocates without bound, on any bytes.
#include <cstddef>
#include <cstdint>

#include "atproto/car.hpp"
#include "atproto/repo.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const atfill::ByteView in(data, size);
  auto car = atfill::atproto::CarReader::Open(in);
  if (car.ok()) {
    atfill::atproto::CarBlock block;
    while (true) {
      auto more = car->Next(&block);
      if (!more.ok() || !*more) break;
    }
  }
  auto repo = atfill::atproto::RepoReader::Open(in);
  if (repo.ok()) {
    std::vector<atfill::atproto::RecordError> errors;
    (void)repo->ForEachRecord(
        [](const atfill::atproto::RepoRecord& r) -> atfill::Status {
          (void)r.ToJson();
          return atfill::Status::OK();
        },
        &errors);
  }
  return 0;
}
