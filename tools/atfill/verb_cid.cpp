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
#include "tools/atfill/line_blocks.hpp"

namespace atfill::cli {
namespace {

void Compute(LineBlock* b) {
  for (size_t i = 0; i < b->lines.size(); ++i) {
    std::string_view line = b->lines[i];
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    auto cid = atproto::CidOfRecord(line);
    if (cid.ok()) {
      b->out += cid->ToString();
    } else {
      b->errors +=
          "error: line " + std::to_string(b->first_line + i) + ": " + cid.status().message() + "\n";
      ++b->bad;
    }
    b->out.push_back('\n');
  }
}

// Processes one stream; returns false when some line failed. `line_no` continues across files.
// The CIDs of a block are computed on any core, and the output is the same as one core's, line
// for line (RunLineBlocks).
bool CidLines(std::istream& in, size_t* line_no) {
  return RunLineBlocks(in, line_no, Compute) == 0;
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
