#!/usr/bin/env python3
"""cmake --install of the tested build tree into a temporary prefix, then, with only that prefix:

* the layout: the launcher, libatfill.a, the CMake package, atfill.pc, the public headers (and
  not the engine's private ones), the version the same everywhere (atfill --version, the CMake
  package's version file, pkg-config);
* every installed header compiles on its own, and none includes a third-party header;
* docs/embedding.md's program and CMakeLists.txt, taken from the page's text, build with
  find_package(atfill) and, the program, with pkg-config; both run on generated Jetstream lines
  and write exactly the posts of the file;
* examples/ builds as a standalone project against the prefix and its two programs run.

Usage: install_test.py BUILD_DIR SOURCE_DIR GEN_EVENTS
Exits 0 when every check holds, 1 naming the first that does not.
"""

import json
import os
import re
import sqlite3
import sys

from steps import check, run, run_in_scratch

# The installed headers include only the standard library's: a program needs the dependencies'
# development packages to link, never to compile against atfill's headers.
STD_HEADER = re.compile(r"^[a-z_0-9]+$")




def fenced_blocks(markdown, language):
    return re.findall(r"^```" + language + r"\n(.*?)^```$", markdown, re.S | re.M)


def expected_posts(events_path):
    """The AT URIs of the posts the event lines create (the file has no updates nor deletes)."""
    uris = set()
    with open(events_path) as f:
        for line in f:
            e = json.loads(line)
            c = e.get("commit")
            if e.get("kind") == "commit" and c and c["collection"] == "app.bsky.feed.post":
                check(c["operation"] == "create", f"unexpected operation in {line}")
                uris.add(f"at://{e['did']}/{c['collection']}/{c['rkey']}")
    return uris


def table(db):
    with sqlite3.connect(db) as conn:
        return {row[0]: row[1] for row in conn.execute("SELECT uri, collection FROM atfill_records")}


def check_layout(prefix):
    for path in ["bin/atfill", "lib/libatfill.a", "lib/cmake/atfill/atfillConfig.cmake",
                 "lib/cmake/atfill/atfillConfigVersion.cmake", "lib/cmake/atfill/atfillTargets.cmake",
                 "lib/pkgconfig/atfill.pc", "include/atfill/pipeline/run.hpp",
                 "include/atfill/base/version.hpp", "share/atfill/demo/sample.car",
                 "share/atfill/grafana/atfill.json", "share/doc/atfill/embedding.md",
                 "share/doc/atfill/examples/CMakeLists.txt"]:
        check(os.path.isfile(os.path.join(prefix, path)), f"{path} is not installed")
    # The engine's internals and the launcher's own headers stay out.
    for path in ["pipeline/engine_graph.hpp", "sinks/sqlite_util.hpp", "tools/atfill/cli.hpp",
                 "state/codec.hpp"]:
        check(not os.path.exists(os.path.join(prefix, "include/atfill", path)),
              f"the private header {path} is installed")
    # The service's files come only with the Debian package.
    check(not os.path.exists(os.path.join(prefix, "etc")), "a plain install wrote etc/")

    version = run([os.path.join(prefix, "bin/atfill"), "--version"]).splitlines()[0]
    m = re.fullmatch(r"atfill (\d+\.\d+\.\d+)", version)
    check(m, f"atfill --version's first line is {version!r}")
    version = m.group(1)
    config_version = open(os.path.join(prefix, "lib/cmake/atfill/atfillConfigVersion.cmake")).read()
    check(f'set(PACKAGE_VERSION "{version}")' in config_version,
          "atfillConfigVersion.cmake names another version than atfill --version")
    env = dict(os.environ, PKG_CONFIG_PATH=os.path.join(prefix, "lib/pkgconfig"))
    pc_version = run(["pkg-config", "--modversion", "atfill"], env=env).strip()
    check(pc_version == version, f"atfill.pc says {pc_version}, atfill --version {version}")


def check_headers(prefix, work):
    include = os.path.join(prefix, "include/atfill")
    headers = []
    for root, _, files in os.walk(include):
        for name in files:
            path = os.path.join(root, name)
            headers.append(os.path.relpath(path, include))
            for line in open(path):
                m = re.match(r"\s*#\s*include\s*<([^>]+)>", line)
                if m:
                    check(STD_HEADER.match(m.group(1)),
                          f"installed header {headers[-1]} includes <{m.group(1)}>")
    check(len(headers) > 20, f"only {len(headers)} headers installed")
    # Each header alone (one translation unit each, compiled in one compiler call).
    sources = []
    for i, h in enumerate(sorted(headers)):
        src = os.path.join(work, f"header_{i}.cpp")
        with open(src, "w") as f:
            f.write(f'#include "{h}"\n')
        sources.append(src)
    run(["c++", "-std=c++20", "-fsyntax-only", "-Wall", "-Wextra", "-Werror", "-I", include]
        + sources, what="compiling each installed header alone")


def build_doc_program(prefix, source, work, events):
    doc = open(os.path.join(source, "docs/embedding.md")).read()
    programs = [b for b in fenced_blocks(doc, "cpp") if "int main(" in b]
    projects = [b for b in fenced_blocks(doc, "cmake") if "find_package(atfill" in b]
    check(len(programs) == 1, f"docs/embedding.md has {len(programs)} cpp blocks with a main")
    check(len(projects) == 1, f"docs/embedding.md has {len(projects)} CMakeLists.txt blocks")
    program, project = programs[0], projects[0]
    check(20 <= program.count("\n") <= 60, "the doc's program is not about 30 lines")
    m = re.search(r"add_executable\((\w+) (\S+\.cpp)\)", project)
    check(m, "the doc's CMakeLists.txt has no add_executable(NAME FILE.cpp)")
    target, cpp = m.groups()
    src = os.path.join(work, "doc")
    os.makedirs(src)
    with open(os.path.join(src, "CMakeLists.txt"), "w") as f:
        f.write(project)
    with open(os.path.join(src, cpp), "w") as f:
        f.write(program)

    posts = expected_posts(events)
    check(len(posts) > 50, f"the generated file holds only {len(posts)} posts")

    def runs_and_writes_the_posts(binary, name):
        out = os.path.join(work, name)
        os.makedirs(out)
        printed = run([binary, events, os.path.join(out, "posts.db"), os.path.join(out, "state")],
                      what=f"the doc's program built with {name}")
        m = re.search(r"(\d+) events read, (\d+) records written", printed)
        check(m, f"the doc's program ({name}) printed {printed!r}")
        rows = table(os.path.join(out, "posts.db"))
        check(set(rows) == posts, f"the doc's program ({name}) wrote {len(rows)} rows, "
              f"{len(set(rows) - posts)} not among the file's {len(posts)} posts")
        check(int(m.group(2)) == len(posts), f"it says {m.group(2)} written, {len(posts)} expected")

    build = os.path.join(work, "doc-build")
    run(["cmake", "-S", src, "-B", build, "-G", "Ninja", f"-DCMAKE_PREFIX_PATH={prefix}"],
        what="configuring the doc's CMakeLists.txt")
    run(["cmake", "--build", build], what="building the doc's program")
    runs_and_writes_the_posts(os.path.join(build, target), "cmake")

    env = dict(os.environ, PKG_CONFIG_PATH=os.path.join(prefix, "lib/pkgconfig"))
    flags = run(["pkg-config", "--cflags", "--libs", "atfill"], env=env).split()
    binary = os.path.join(work, "doc-pkgconfig")
    run(["c++", os.path.join(src, cpp), "-o", binary] + flags,
        what="building the doc's program with pkg-config's flags")
    runs_and_writes_the_posts(binary, "pkg-config")


def build_examples(prefix, source, work, events):
    examples = os.path.join(source, "examples")
    for name in ["CMakeLists.txt", "embed_batch.cpp", "embed_config.cpp"]:
        installed = os.path.join(prefix, "share/doc/atfill/examples", name)
        check(open(installed).read() == open(os.path.join(examples, name)).read(),
              f"the installed examples/{name} differs from the source's")
    build = os.path.join(work, "examples-build")
    run(["cmake", "-S", examples, "-B", build, "-G", "Ninja", f"-DCMAKE_PREFIX_PATH={prefix}"],
        what="configuring examples/ standalone")
    run(["cmake", "--build", build], what="building examples/ standalone")
    out = os.path.join(work, "examples-out")
    os.makedirs(out)
    printed = run([os.path.join(build, "embed_batch"), events, os.path.join(out, "batch.db"),
                   os.path.join(out, "batch-state")], what="embed_batch")
    check(re.search(r"job 1 completed: \d+ events", printed), f"embed_batch printed {printed!r}")
    config = os.path.join(out, "atfill.toml")
    with open(config, "w") as f:
        f.write('[state]\ndir = "state"\n[sink.sqlite]\npath = "config.db"\n')
    printed = run([os.path.join(build, "embed_config"), config, events], what="embed_config")
    check(re.search(r"job 1 completed: \d+ events", printed), f"embed_config printed {printed!r}")
    check(table(os.path.join(out, "batch.db")) == table(os.path.join(out, "config.db")),
          "embed_batch and embed_config wrote different tables from one file")


def main():
    if len(sys.argv) != 4:
        print(__doc__, file=sys.stderr)
        return 2
    build, source, gen_events = sys.argv[1:]

    def steps(work):
        prefix = os.path.join(work, "prefix")
        run(["cmake", "--install", build, "--prefix", prefix], what="cmake --install")
        check_layout(prefix)
        print("install_test: the layout and the version hold", flush=True)
        check_headers(prefix, work)
        print("install_test: every installed header compiles alone", flush=True)
        events = os.path.join(work, "events.jsonl")
        run([gen_events, events, "--events", "3000", "--dids", "200", "--updates", "0",
             "--deletes", "0", "--accounts", "0", "--seed", "24"], what="gen-events")
        build_doc_program(prefix, source, work, events)
        print("install_test: docs/embedding.md's program builds (CMake, pkg-config) and runs",
              flush=True)
        build_examples(prefix, source, work, events)
        print("install_test: examples/ builds against the prefix and runs", flush=True)

    return run_in_scratch("install_test", steps)


if __name__ == "__main__":
    sys.exit(main())
