#!/usr/bin/env python3
"""tools/check-size: the real tree passes; a tree with a source file of 1,001 lines fails naming
it, while one of 1,000 lines, a long test file and a long file in a build folder pass.

Usage: check_size_test.py CHECK_SIZE REPO_ROOT
"""

import os
import subprocess
import sys
import tempfile

failures = []


def expect(cond, what):
    if not cond:
        failures.append(what)
        print("FAILED: " + what)


def run(check, root):
    p = subprocess.run([sys.executable, check, "--root", root], capture_output=True, text=True)
    return p.returncode, p.stdout + p.stderr


def write(root, rel, lines):
    path = os.path.join(root, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write("// line\n" * lines)


def main():
    check, repo = sys.argv[1:3]
    rc, out = run(check, repo)
    print(out)
    expect(rc == 0, f"the real tree passes (exit {rc})")

    with tempfile.TemporaryDirectory(prefix="check-size-") as tmp:
        write(tmp, "stages/small.cpp", 1000)
        write(tmp, "tests/stages/long_test.cpp", 3000)
        write(tmp, "build/generated/long.hpp", 3000)
        rc, out = run(check, tmp)
        print(out)
        expect(rc == 0, f"1,000 lines, a test and a build folder pass (exit {rc})")
        write(tmp, "sources/family/long.cpp", 1001)
        write(tmp, "tools/long-script", 1200)
        rc, out = run(check, tmp)
        print(out)
        expect(rc == 1, f"a file over the limit fails (exit {rc})")
        expect("sources/family/long.cpp: 1001 lines" in out, "the long source is named")
        expect("tools/long-script: 1200 lines" in out, "the long script is named")
        expect("small.cpp" not in out and "long_test" not in out, "nothing else is named")

    if failures:
        print(f"check_size_test: {len(failures)} failure(s)")
        return 1
    print("check_size_test: passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
