#include <cstdio>
#include <string>
#include <vector>

#include "atproto/syntax.hpp"
#include "tools/atfill/args.hpp"
#include "tools/atfill/cli.hpp"

namespace atfill::cli {

int RunSyntax(std::span<char* const> args) {
  std::string kind_name;
  CLI::App app{"", "atfill syntax"};
  PrepareVerbApp(app);
  // The values are taken as they are, even one that starts with '-': everything after KIND.
  app.prefix_command();
  app.add_option("KIND", kind_name, "what the values are")->required();
  if (auto rc = ParseVerbArgs(app, args)) return *rc;
  const std::vector<std::string> values = app.remaining();
  if (values.empty()) {
    std::fprintf(stderr, "usage: atfill syntax KIND VALUE...  (atfill syntax --help)\n");
    return kExitUsage;
  }
  auto kind = atproto::ParseSyntaxKind(kind_name);
  if (!kind.ok()) {
    std::fprintf(stderr, "atfill syntax: %s\n", kind.status().message().c_str());
    return kExitUsage;
  }
  bool all_valid = true;
  for (const std::string& value : values) {
    const Status s = atproto::ValidateSyntax(*kind, value);
    if (s.ok()) {
      std::printf("valid\n");
    } else {
      all_valid = false;
      std::printf("invalid: %s\n", s.message().c_str());
    }
  }
  return all_valid ? kExitOk : kExitInputInvalid;
}

}  // namespace atfill::cli
