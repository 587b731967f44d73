// Files of records, one JSON object a line, processed in blocks on every core and printed in
// input order, as one core would print them (atfill cid, atfill validate).
#pragma once

#include <cstddef>
#include <functional>
#include <istream>
#include <string>
#include <vector>

namespace atfill::cli {

// One block of input lines and what they print.
struct LineBlock {
  size_t first_line = 0;  // the line number of lines[0]
  std::vector<std::string> lines;
  std::string out;     // stdout: one line per input line
  std::string errors;  // stderr, written just before `out`
  size_t bad = 0;      // input lines that failed
};

// Reads `in` in blocks; `compute` fills a block's out, errors and bad on any core (it must be
// thread-safe); each block's errors then its out are written in input order. `line_no` counts the
// lines read and continues across calls (files read one after another). Returns the bad lines.
size_t RunLineBlocks(std::istream& in, size_t* line_no,
                     const std::function<void(LineBlock*)>& compute);

}  // namespace atfill::cli
