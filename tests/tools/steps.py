"""What install_test.py and package_test.py share: checks that stop the test at the first one that
fails, commands whose output is kept for the failure's message (a missing program fails too: the
test never skips), and a scratch folder removed at the end."""

import shutil
import subprocess
import sys
import tempfile


class Failure(Exception):
    pass


def check(condition, what):
    if not condition:
        raise Failure(what)


def run(args, cwd=None, env=None, what=None, codes=(0,)):
    """Runs `args`; returns its stdout, or fails when its exit code is not in `codes`."""
    try:
        r = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True)
    except FileNotFoundError:
        raise Failure(f"{args[0]} is not installed (tools/setup installs it)")
    if r.returncode not in codes:
        raise Failure(f"{what or ' '.join(map(str, args))} exited {r.returncode}:\n"
                      f"{r.stdout[-4000:]}\n{r.stderr[-4000:]}")
    return r.stdout


def run_in_scratch(name, body):
    """Calls body(work) with a fresh scratch folder; returns the exit code: 0, or 1 after printing
    the failure."""
    work = tempfile.mkdtemp(prefix=f"atfill-{name}-")
    try:
        body(work)
    except Failure as e:
        print(f"{name}: FAILED: {e}", file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0
