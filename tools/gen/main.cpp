// gen-events: writes synthetic Jetstream v1 event lines (see event_gen.hpp).
//   build/gen-events OUT [--events N] [--dids N] [--seed N] [--body BYTES] [--updates R]
//                        [--deletes R] [--accounts R] [--bad R] [--run N] [--zstd]
#include <CLI/CLI.hpp>
#include <cstdio>
#include <string>

#include "tools/gen/event_gen.hpp"

int main(int argc, char** argv) {
  atfill::gen::EventGenOptions o;
  std::string out;
  uint64_t events = 1000;
  bool zstd = false;
  CLI::App app{"Writes synthetic Jetstream v1 event lines (with real CIDs) to OUT.", "gen-events"};
  app.add_option("OUT", out, "the file to write")->required();
  app.add_option("--events", events, "events to write")->capture_default_str();
  app.add_option("--dids", o.dids, "accounts")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--seed", o.seed, "random seed")->capture_default_str();
  app.add_option("--body", o.body_bytes, "approximate record body size, bytes")
      ->capture_default_str();
  app.add_option("--updates", o.update_ratio, "share of updates")->check(CLI::Range(0.0, 1.0));
  app.add_option("--deletes", o.delete_ratio, "share of deletes")->check(CLI::Range(0.0, 1.0));
  app.add_option("--accounts", o.account_ratio, "share of account events")
      ->check(CLI::Range(0.0, 1.0));
  app.add_option("--bad", o.bad_ratio, "share of bad lines")->check(CLI::Range(0.0, 1.0));
  app.add_option("--run", o.run_length,
                 "accounts in runs of this many events (a crawl's order); 1 = each event's account "
                 "drawn at random (a stream's order)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_flag("--zstd", zstd, "compress the file with zstd");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help prints and exits 0; a bad command line exits 2, as the launcher's verbs do.
    return app.exit(e) == 0 ? 0 : 2;
  }
  const atfill::Status s = atfill::gen::EventGenerator::WriteFile(o, events, out, zstd);
  if (!s.ok()) {
    std::fprintf(stderr, "gen-events: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
