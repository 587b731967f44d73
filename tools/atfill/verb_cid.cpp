#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>
#include <string_view>
#include <vector>

#include "atproto/json.hpp"
#include "tools/atfill/args.hpp"
#include "tools/atfill/cli.hpp"

namespace atfill::cli {
namespace {

// Processes one stream; returns false when some line failed. `line_no` continues across files.
bool CidLines(std::istream& in, size_t* line_no) {
  bool all_ok = true;
  std::string line;
  std::string out;
  while (std::getline(in, line)) {
    ++*line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    auto cid = atproto::CidOfRecord(line);
    if (cid.ok()) {
      out = cid->ToString();
    } else {
      out.clear();
      all_ok = false;
      std::fprintf(stderr, "error: line %zu: %s\n", *line_no, cid.status().message().c_str());
    }
    out.push_back('\n');
    std::fwrite(out.data(), 1, out.size(), stdout);
  }
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
