#!/usr/bin/env python3
"""The Debian package of the tested build tree (CPack, as tools/package makes it), checked without
installing it on this machine:

* its control fields: the version the launcher reports, a Depends naming the Debian package of
  every shared library the launcher loads (as this machine resolves them), adduser for postinst;
  the conffile; maintainer scripts that parse;
* its contents: the launcher, the library, headers, CMake package and pkg-config file, the docs,
  the demo's files, the Grafana dashboard, the systemd unit and the example config;
* lintian finds no error or warning beyond the package's overrides;
* extracted into a scratch root, its atfill runs from there: --version, the demo (on the files
  the package carries) and `jobs` on the packaged config.

Usage: package_test.py BUILD_DIR
dpkg-deb, lintian and cpack must be installed (tools/setup installs them): a missing tool fails
the test. Exits 0 when every check holds, 1 naming the first that does not.
"""

import os
import re
import subprocess
import sys

from steps import check, run, run_in_scratch




def control_fields(info):
    fields, key = {}, None
    for line in info.splitlines():
        m = re.match(r"^ ([A-Za-z-]+): (.*)$", line)
        if m:
            key = m.group(1)
            fields[key] = m.group(2)
        elif key and line.startswith("  "):
            fields[key] += "\n" + line.strip()
    return fields


def depends_names(depends):
    return {re.split(r"[ (:]", alt.strip())[0] for dep in depends.split(",")
            for alt in dep.split("|")}


def packages_of_needed_libraries(binary):
    """{soname: Debian package} of each shared library `binary` links directly (its NEEDED
    entries), as this machine resolves them."""
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", run(["readelf", "-d", binary]))
    check(len(needed) > 5, f"readelf found only {needed}")
    found = dict(re.findall(r"^\s*(\S+) => (/\S+) ", run(["ldd", binary]), re.M))
    owners = {}
    for soname in needed:
        check(soname in found, f"ldd does not resolve {soname}")
        path = found[soname]
        # dpkg knows a library by the path its package ships it at: /lib or /usr/lib (merged /usr).
        other = path[4:] if path.startswith("/usr/") else "/usr" + path
        for candidate in (path, other):
            r = subprocess.run(["dpkg-query", "-S", candidate], capture_output=True, text=True)
            if r.returncode == 0:
                owners[soname] = r.stdout.split(":")[0]
                break
        check(soname in owners, f"no Debian package owns {path} ({soname})")
    return owners


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    build = os.path.abspath(sys.argv[1])

    def steps(work):
        out = os.path.join(work, "out")
        run(["cpack", "-G", "DEB", "--config", os.path.join(build, "CPackConfig.cmake"),
             "-B", os.path.join(work, "staging"), "-D", f"CPACK_OUTPUT_FILE_PREFIX={out}"],
            cwd=build, what="cpack -G DEB")
        debs = [os.path.join(out, f) for f in os.listdir(out) if f.endswith(".deb")]
        check(len(debs) == 1, f"cpack made {debs}")
        deb = debs[0]

        root = os.path.join(work, "root")
        run(["dpkg-deb", "-x", deb, root])
        atfill = os.path.join(root, "usr/bin/atfill")
        version_line = run([atfill, "--version"], what="the extracted atfill --version").splitlines()
        m = re.fullmatch(r"atfill (\d+\.\d+\.\d+)", version_line[0])
        check(m, f"the extracted atfill --version says {version_line[0]!r}")
        version = m.group(1)
        arch = run(["dpkg", "--print-architecture"]).strip()
        check(os.path.basename(deb) == f"atfill_{version}-1_{arch}.deb",
              f"the package is named {os.path.basename(deb)}")

        fields = control_fields(run(["dpkg-deb", "--info", deb]))
        check(fields.get("Package") == "atfill", f"Package: {fields.get('Package')}")
        check(fields.get("Version") == f"{version}-1", f"Version: {fields.get('Version')}")
        depends = depends_names(fields.get("Depends", ""))
        needed = packages_of_needed_libraries(atfill)
        missing = sorted({pkg for pkg in needed.values()} - depends)
        check(not missing, f"Depends lacks {missing} (the launcher loads their libraries); "
              f"Depends: {sorted(depends)}")
        for pkg in ["adduser", "libsqlite3-0", "libtbb12", "libpq5", "libcurl4", "libzstd1",
                    "liblua5.4-0"]:
            check(pkg in depends, f"Depends lacks {pkg}: {sorted(depends)}")
        conffiles = run(["dpkg-deb", "--info", deb, "conffiles"]).split()
        check(conffiles == ["/etc/atfill/atfill.toml"], f"conffiles: {conffiles}")
        control = os.path.join(work, "control")
        run(["dpkg-deb", "-e", deb, control])
        for script in ["postinst", "prerm", "postrm"]:
            path = os.path.join(control, script)
            check(os.access(path, os.X_OK), f"{script} is missing or not executable")
            run(["sh", "-n", path], what=f"sh -n {script}")
        postinst = open(os.path.join(control, "postinst")).read()
        check("adduser --system" in postinst and "/var/lib/atfill" in postinst,
              "postinst does not make the atfill user and /var/lib/atfill")

        contents = {line.split()[-1].lstrip(".") for line in
                    run(["dpkg-deb", "--contents", deb]).splitlines()}
        for path in ["/usr/bin/atfill", "/usr/lib/libatfill.a", "/usr/include/atfill/pipeline/run.hpp",
                     "/usr/lib/cmake/atfill/atfillConfig.cmake", "/usr/lib/pkgconfig/atfill.pc",
                     "/usr/share/doc/atfill/copyright", "/usr/share/doc/atfill/changelog.Debian.gz",
                     "/usr/share/doc/atfill/embedding.md", "/usr/share/doc/atfill/packaging.md",
                     "/usr/share/atfill/demo/sample.car", "/usr/share/atfill/grafana/atfill.json",
                     "/lib/systemd/system/atfill.service", "/etc/atfill/atfill.toml"]:
            check(path in contents, f"the package lacks {path}")

        unit = open(os.path.join(root, "lib/systemd/system/atfill.service")).read()
        for line in ["ExecStart=/usr/bin/atfill run /etc/atfill/atfill.toml", "User=atfill",
                     "StateDirectory=atfill", "WorkingDirectory=/var/lib/atfill",
                     "Restart=on-failure", "WantedBy=multi-user.target"]:
            check(re.search("^" + re.escape(line) + "$", unit, re.M), f"the unit lacks {line}")
        print("package_test: the control fields, scripts, contents and unit hold", flush=True)

        lint = run(["lintian", "--fail-on", "error,warning", deb], what="lintian", codes=(0, 1, 2))
        check(not re.search(r"^[EW]: ", lint, re.M), f"lintian:\n{lint}")
        print("package_test: lintian finds no error or warning", flush=True)

        demo = run([atfill, "demo"], cwd=work, what="the extracted atfill demo")
        check(f"on {root}/usr/share/atfill/demo" in demo,
              "the extracted demo did not run on the packaged files")
        check("every step answered as expected" in demo, f"the demo said:\n{demo[-2000:]}")
        # The packaged config, with its /var/lib/atfill in the scratch root.
        var = os.path.join(root, "var/lib/atfill")
        os.makedirs(var)
        config = os.path.join(var, "atfill.toml")
        with open(os.path.join(root, "etc/atfill/atfill.toml")) as f:
            text = f.read()
        check("/var/lib/atfill/" in text, "the packaged config keeps nothing in /var/lib/atfill")
        with open(config, "w") as f:
            f.write(text.replace("/var/lib/atfill", var))
        env = dict(os.environ, ATFILL_ADMIN_TOKEN="package-test-token")
        jobs = run([atfill, "jobs", config], env=env, what="atfill jobs on the packaged config")
        check("(no jobs yet)" in jobs, f"atfill jobs said {jobs!r}")
        # A reading verb writes nothing; a job writes its state and its table where configured.
        check(not os.path.exists(os.path.join(var, "state")), "atfill jobs made a state folder")
        events = os.path.join(work, "events.jsonl")
        open(events, "w").close()
        ingest = run([atfill, "ingest", config, events], env=env, what="atfill ingest on the packaged config")
        check(os.path.isdir(os.path.join(var, "state")),
              f"the state folder is not where configured; atfill ingest said {ingest!r}")
        check(os.path.isfile(os.path.join(var, "atfill.db")),
              f"the database is not where configured; atfill ingest said {ingest!r}")
        print("package_test: the extracted atfill runs the demo and reads the packaged config",
              flush=True)

    return run_in_scratch("package_test", steps)


if __name__ == "__main__":
    sys.exit(main())
