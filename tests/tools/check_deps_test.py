#!/usr/bin/env python3
"""tools/check-deps: the real tree passes; a copy of it with violating includes fails, naming
each one (file, line, folder and include) and nothing else.

Usage: check_deps_test.py CHECK_DEPS REPO_ROOT DEFAULT_SHARED_DIR
The table is DESIGN.md in $ATFILL_SHARED when set, else in DEFAULT_SHARED_DIR.
"""

import os
import shutil
import subprocess
import sys
import tempfile

FOLDERS = ["base", "atproto", "net", "state", "pipeline", "sources", "stages", "sinks"]

# (file in the copy, include injected): each breaks a different rule of the table.
INJECTED = [
    # stages/ may not depend on sinks/.
    ("stages/cid_verify.cpp", "sinks/sqlite_sink.hpp"),
    # base/ depends on nothing of ours.
    ("base/status.hpp", "atproto/syntax.hpp"),
    # sinks/ names pipeline/, which names state/: the rows are not transitive.
    ("sinks/sqlite_sink.cpp", "state/kv_store.hpp"),
    # sources/ may not depend on stages/, also from a subfolder.
    ("sources/crawl/host_scheduler.cpp", "stages/cid_verify.hpp"),
]

failures = []


def expect(cond, what):
    if not cond:
        failures.append(what)
        print("FAILED: " + what)


def run(check, root, design):
    p = subprocess.run(
        [sys.executable, check, "--root", root, "--design", design],
        capture_output=True,
        text=True,
    )
    return p.returncode, p.stdout, p.stderr


def main():
    check, repo, default_shared = sys.argv[1:4]
    shared = os.environ.get("ATFILL_SHARED") or default_shared
    design = os.path.join(shared, "DESIGN.md")
    if not os.path.isfile(design):
        print(f"check_deps_test: {design} is missing (the shared folder is required)")
        return 1

    # The real tree follows the table.
    rc, out, err = run(check, repo, design)
    print(out + err)
    expect(rc == 0, f"the real tree passes (exit {rc})")

    with tempfile.TemporaryDirectory(prefix="check-deps-") as tmp:
        for folder in FOLDERS:
            shutil.copytree(os.path.join(repo, folder), os.path.join(tmp, folder))
        # The unchanged copy passes too, so what fails below is the injection.
        rc, out, err = run(check, tmp, design)
        expect(rc == 0, f"the unchanged copy passes (exit {rc}): {out}{err}")

        wanted = []
        for rel, include in INJECTED:
            path = os.path.join(tmp, rel)
            with open(path, encoding="utf-8") as f:
                lines = f.read().split("\n")
            # After the file's first line, where includes are.
            lines.insert(1, f'#include "{include}"')
            with open(path, "w", encoding="utf-8") as f:
                f.write("\n".join(lines))
            folder = rel.split("/", 1)[0]
            wanted.append(f'{rel}:2: {folder}/ includes "{include}"')
        rc, out, err = run(check, tmp, design)
        print(out + err)
        expect(rc == 1, f"the copy with violating includes fails with exit 1 (exit {rc})")
        reported = [l for l in out.splitlines() if not l.startswith("check-deps:")]
        for w in wanted:
            expect(any(l.startswith(w) for l in reported), f"reported: {w}")
        expect(len(reported) == len(wanted), f"only the injected includes: {reported}")

        # An allowed include (stages/ on net/) is not reported.
        path = os.path.join(tmp, "stages", "cid_verify.cpp")
        with open(path, encoding="utf-8") as f:
            text = f.read()
        with open(path, "w", encoding="utf-8") as f:
            f.write(text.replace('#include "sinks/sqlite_sink.hpp"', '#include "net/endpoint.hpp"'))
        rc, out, err = run(check, tmp, design)
        expect(rc == 1 and "stages/cid_verify.cpp" not in out, f"an allowed include passes: {out}")

    # Without the table the check cannot pass.
    rc, out, err = run(check, repo, os.path.join(repo, "no-such-DESIGN.md"))
    expect(rc == 2, f"a missing table is exit 2 (exit {rc})")

    print(f"check_deps_test: {len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
