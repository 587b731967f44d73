// gen-events: writes synthetic Jetstream v1 event lines (see event_gen.hpp).
//   build/gen-events OUT [--events N] [--dids N] [--seed N] [--body BYTES] [--updates R]
//                        [--deletes R] [--accounts R] [--bad R] [--run N] [--zstd]
#include <cstdio>
#include <cstdlib>
#include <string>

#include "tools/gen/event_gen.hpp"

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr,
                 "usage: gen-events OUT [--events N] [--dids N] [--seed N] [--body BYTES] "
                 "[--updates R] [--deletes R] [--accounts R] [--bad R] [--run N] [--zstd]\n");
    return 2;
  }
  atfill::gen::EventGenOptions o;
  uint64_t events = 1000;
  bool zstd = false;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "gen-events: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--events")
      events = std::strtoull(next(), nullptr, 10);
    else if (a == "--dids")
      o.dids = static_cast<uint32_t>(std::strtoul(next(), nullptr, 10));
    else if (a == "--seed")
      o.seed = std::strtoull(next(), nullptr, 10);
    else if (a == "--body")
      o.body_bytes = static_cast<uint32_t>(std::strtoul(next(), nullptr, 10));
    else if (a == "--updates")
      o.update_ratio = std::strtod(next(), nullptr);
    else if (a == "--deletes")
      o.delete_ratio = std::strtod(next(), nullptr);
    else if (a == "--accounts")
      o.account_ratio = std::strtod(next(), nullptr);
    else if (a == "--bad")
      o.bad_ratio = std::strtod(next(), nullptr);
    else if (a == "--run")
      o.run_length = static_cast<uint32_t>(std::strtoul(next(), nullptr, 10));
    else if (a == "--zstd")
      zstd = true;
    else {
      std::fprintf(stderr, "gen-events: unknown option %s\n", a.c_str());
      return 2;
    }
  }
  const atfill::Status s = atfill::gen::EventGenerator::WriteFile(o, events, argv[1], zstd);
  if (!s.ok()) {
    std::fprintf(stderr, "gen-events: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
