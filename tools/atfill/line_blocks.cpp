#include "tools/atfill/line_blocks.hpp"

#include <oneapi/tbb/parallel_pipeline.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <thread>

namespace atfill::cli {
namespace {

// Lines in blocks of this many: large enough that a worker's hand-offs cost nothing beside the
// block's work, small enough that the blocks in flight stay a few MB.
constexpr size_t kBlockLines = 2048;

}  // namespace

size_t RunLineBlocks(std::istream& in, size_t* line_no,
                     const std::function<void(LineBlock*)>& compute) {
  size_t bad = 0;
  const size_t tokens = 4 * static_cast<size_t>(std::max(1u, std::thread::hardware_concurrency()));
  tbb::parallel_pipeline(
      tokens, tbb::make_filter<void, LineBlock*>(tbb::filter_mode::serial_in_order,
                                                 [&](tbb::flow_control& fc) -> LineBlock* {
                                                   auto b = std::make_unique<LineBlock>();
                                                   b->first_line = *line_no + 1;
                                                   std::string line;
                                                   while (b->lines.size() < kBlockLines &&
                                                          std::getline(in, line)) {
                                                     b->lines.push_back(std::move(line));
                                                   }
                                                   if (b->lines.empty()) {
                                                     fc.stop();
                                                     return nullptr;
                                                   }
                                                   *line_no += b->lines.size();
                                                   return b.release();
                                                 }) &
                  tbb::make_filter<LineBlock*, LineBlock*>(tbb::filter_mode::parallel,
                                                           [&](LineBlock* b) {
                                                             compute(b);
                                                             return b;
                                                           }) &
                  tbb::make_filter<LineBlock*, void>(
                      tbb::filter_mode::serial_in_order, [&](LineBlock* raw) {
                        std::unique_ptr<LineBlock> b(raw);
                        if (!b->errors.empty()) {
                          std::fflush(stdout);
                          std::fwrite(b->errors.data(), 1, b->errors.size(), stderr);
                        }
                        std::fwrite(b->out.data(), 1, b->out.size(), stdout);
                        bad += b->bad;
                      }));
  return bad;
}

}  // namespace atfill::cli
