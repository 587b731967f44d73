// What every decoded `.jss` block must satisfy, shared by the segment and block targets.
#pragma once

#include <string>
#include <vector>

#include "sources/archive/jss.hpp"
#include "tests/fuzz/fuzz_util.hpp"

namespace atfill::fuzz {

// A parsed block body is canonical: its rows serialize back to exactly its bytes, and the
// encoder's frame of those rows decompresses to them again.
inline void CheckBlock(const jss::Block& block) {
  std::vector<jss::Row> rows;
  rows.reserve(block.size());
  for (size_t i = 0; i < block.size(); ++i) {
    rows.push_back(block.row(i));
    Check(jss::ValidateRow(rows.back()).ok(), "a parsed row is a valid row");
  }
  const std::string again = jss::SerializeBlockBody(rows);
  Check(again == block.body(), "a block body re-serializes to its bytes");
  if (block.body().size() > (size_t{1} << 16)) return;  // compressing is the slow part
  const std::string frame = jss::EncodeBlockBody(rows);
  auto body =
      jss::DecompressFrame(AsBytes(frame), static_cast<uint32_t>(again.size()), again.size());
  Check(body.ok() && *body == again, "an encoded block decompresses to its body");
}

}  // namespace atfill::fuzz
