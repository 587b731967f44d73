#include <cstdio>
#include <string>

#include "atproto/syntax.hpp"
#include "tools/atfill/cli.hpp"

namespace atfill::cli {

int RunSyntax(std::span<char* const> args) {
  if (args.size() < 2) {
    std::fprintf(stderr, "usage: atfill syntax KIND VALUE...  (atfill syntax --help)\n");
    return kExitUsage;
  }
  auto kind = atproto::ParseSyntaxKind(args[0]);
  if (!kind.ok()) {
    std::fprintf(stderr, "atfill syntax: %s\n", kind.status().message().c_str());
    return kExitUsage;
  }
  bool all_valid = true;
  for (size_t i = 1; i < args.size(); ++i) {
    const Status s = atproto::ValidateSyntax(*kind, args[i]);
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
