#include <oneapi/tbb/parallel_pipeline.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "atproto/json.hpp"
#include "tools/atfill/args.hpp"
#include "tools/atfill/cli.hpp"

namespace atfill::cli {
namespace {

// Lines in blocks of this many: large enough that a worker's hand-offs cost nothing beside the
// block's CIDs, small enough that the blocks in flight stay a few MB.
constexpr size_t kBlockLines = 2048;

// One block of input lines and what they print, in input order.
struct Block {
  size_t first_line = 0;  // the line number of lines[0]
  std::vector<std::string> lines;
  std::string out;     // one CID (or an empty line) per input line
  std::string errors;  // "error: line N: ..." lines; empty when every line had a CID
};

void Compute(Block* b) {
  for (size_t i = 0; i < b->lines.size(); ++i) {
    std::string_view line = b->lines[i];
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    auto cid = atproto::CidOfRecord(line);
    if (cid.ok()) {
      b->out += cid->ToString();
    } else {
      b->errors +=
          "error: line " + std::to_string(b->first_line + i) + ": " + cid.status().message() + "\n";
    }
    b->out.push_back('\n');
  }
}

// Processes one stream; returns false when some line failed. `line_no` continues across files.
// Reading and writing are serial and in order; the CIDs of a block are computed on any core (a
// oneTBB pipeline), so the output is the same as one core's, line for line.
bool CidLines(std::istream& in, size_t* line_no) {
  bool all_ok = true;
  const size_t tokens = 4 * static_cast<size_t>(std::max(1u, std::thread::hardware_concurrency()));
  tbb::parallel_pipeline(
      tokens,
      tbb::make_filter<void, Block*>(tbb::filter_mode::serial_in_order,
                                     [&](tbb::flow_control& fc) -> Block* {
                                       auto b = std::make_unique<Block>();
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
          tbb::make_filter<Block*, Block*>(tbb::filter_mode::parallel,
                                           [](Block* b) {
                                             Compute(b);
                                             return b;
                                           }) &
          tbb::make_filter<Block*, void>(tbb::filter_mode::serial_in_order, [&](Block* raw) {
            std::unique_ptr<Block> b(raw);
            // Each error goes out just before the CIDs of its block, as one core would print it.
            if (!b->errors.empty()) {
              std::fflush(stdout);
              std::fwrite(b->errors.data(), 1, b->errors.size(), stderr);
            }
            std::fwrite(b->out.data(), 1, b->out.size(), stdout);
            all_ok = all_ok && b->errors.empty();
          }));
  return all_ok;
}

}  // namespace

int RunCid(std::span<char* const> args) {
  std::vector<std::string> paths;
  CLI::App app{"", "atfill cid"};
  PrepareVerbApp(app);
  app.add_option("FILE", paths, "files of records, one JSON object a line (none: stdin)");
  if (auto rc = ParseVerbArgs(app, args)) return *rc;
  size_t line_no = 0;
  bool all_ok = true;
  if (paths.empty()) {
    all_ok = CidLines(std::cin, &line_no);
  } else {
    for (const std::string& path : paths) {
      std::ifstream in(path, std::ios::binary);
      if (!in) {
        std::fprintf(stderr, "error: cannot open %s\n", path.c_str());
        return kExitIo;
      }
      // Line numbers run on across files, as if they were concatenated, like the output lines.
      all_ok = CidLines(in, &line_no) && all_ok;
    }
  }
  std::fflush(stdout);
  return all_ok ? kExitOk : kExitInputInvalid;
}

}  // namespace atfill::cli
