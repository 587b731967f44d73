#include <cstdio>
#include <string_view>

#include "tools/atfill/cli.hpp"

namespace atfill::cli {

bool WantsHelp(const Verb& verb, std::span<char* const> args) {
  for (const char* arg : args) {
    const std::string_view a = arg;
    if (a == "-h" || a == "--help") {
      std::fwrite(verb.usage.data(), 1, verb.usage.size(), stdout);
      return true;
    }
    if (a == "--") break;
  }
  return false;
}

std::span<const Verb> Verbs() {
  static const Verb kVerbs[] = {
      {"demo", "run the demonstration on the files the repository ships",
       "usage: atfill demo [--data DIR]\n\n"
       "Shows the inspection verbs (syntax, cid, car) on examples/data.\n"
       "  --data DIR   folder holding records.jsonl and sample.car (default: examples/data)\n",
       RunDemo},
      {"cid", "print the CID of each record (one JSON object per line)",
       "usage: atfill cid [FILE...]\n\n"
       "Reads records, one JSON object per line, from each FILE (or stdin when none is given)\n"
       "and prints each record's CID (dag-cbor, sha2-256), one line per input line. A line that\n"
       "is not a valid atproto record prints an empty line on stdout and\n"
       "'error: line N: <reason>' on stderr, so outputs stay aligned with inputs.\n\n"
       "exit: 0 all lines valid, 1 some line failed, 2 usage, 3 a file could not be read\n",
       RunCid},
      {"car", "verify a CAR repository and print its records",
       "usage: atfill car FILE.car [--key did:key:...]\n\n"
       "Verifies every block's hash and the repository structure, then prints every record as a\n"
       "JSON line {\"uri\",\"cid\",\"record\"}. With --key, also verifies the commit signature.\n"
       "A corrupt or truncated file is an error that names the byte offset.\n\n"
       "exit: 0 valid, 1 corrupt, invalid or bad signature, 2 usage, 3 file unreadable\n",
       RunCar},
      {"syntax", "check atproto identifiers (did, handle, nsid, rkey, ...)",
       "usage: atfill syntax KIND VALUE...\n\n"
       "KIND: did, handle, nsid, rkey, tid, aturi, datetime, cid, atidentifier, language, uri.\n"
       "Prints 'valid' or 'invalid: <reason>' for each VALUE, one per line.\n\n"
       "exit: 0 all valid, 1 some value invalid, 2 usage\n",
       RunSyntax},
  };
  return kVerbs;
}

}  // namespace atfill::cli
