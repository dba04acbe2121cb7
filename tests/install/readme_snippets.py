#!/usr/bin/env python3
"""Builds and runs every fenced code block of README.md against an installed flashattn.

The build is installed into a temporary DESTDIR (as tests/install/consume.sh does), then each
block is handled by its language tag:
  c       written to app.c (the first C block is also the `app.c` the other blocks build),
          compiled against the installed tree with pkg-config's flags and run; it must exit 0
  cmake   appended to a minimal CMakeLists.txt (cmake_minimum_required + project(... C)),
          configured with CMAKE_PREFIX_PATH at the installed prefix, built; ./app run
  sh      run with `sh -e` beside app.c, with PKG_CONFIG_PATH/PKG_CONFIG_SYSROOT_DIR at the
          installed tree and `cc` the build's compiler; if it made ./app, that is run
  meson   appended to `project('app', 'c')` in a parent project beside app.c, set up (the
          dependency found through pkg-config in the installed tree), compiled; ./app run
  python  run from a temporary folder with FA_README_PYTHON (default: this interpreter) if
          `import numpy, flashattn` works there, else reported as SKIPPED with the reason;
          `readme_snippets.py --python [README]` runs only these, strictly, with this interpreter
          (scripts/ci-python.sh, from the venv holding the installed wheel)
A block is exempt only through a line `<!-- readme-snippets: skip NAME (reason) -->` right before
its fence, and only if NAME is listed in EXEMPT below; a marker not listed, or a listed exemption
whose marker is gone, fails the test. A tag with no handler fails the test. Any block that fails
to build or run fails the test.

Environment (tests/install/meson.build): FA_MESON FA_BUILD FA_PREFIX FA_LIBDIR FA_CC FA_SANITIZE
FA_SOURCE FA_CMAKE_PACKAGE (1: the CMake package is installed), optional FA_README (another
README to check) and FA_README_PYTHON.
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

# Blocks the test does not run, by the NAME of their marker in README.md, with why.
EXEMPT = {
    "setup": "the set-up commands build this repository itself; .ci/run runs exactly them",
}

MARKER = re.compile(r"^<!--\s*readme-snippets:\s*skip\s+(\S+)")


def parse(path):
    """[(lang, text, line, exempt_name)] for each fenced block."""
    lines = open(path, encoding="utf-8").read().split("\n")
    blocks, i = [], 0
    while i < len(lines):
        m = re.match(r"^```(\S*)\s*$", lines[i])
        if not m:
            i += 1
            continue
        lang, start = m.group(1), i + 1
        prev = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        marker = MARKER.match(prev)
        j = i + 1
        while j < len(lines) and not lines[j].startswith("```"):
            j += 1
        if j == len(lines):
            sys.exit(f"README.md:{start}: unterminated ``` block")
        blocks.append((lang, "\n".join(lines[i + 1:j]) + "\n", start, marker.group(1) if marker else None))
        i = j + 1
    return blocks


class Failed(Exception):
    pass


def run(cmd, cwd, env, what, timeout=240):
    try:
        p = subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           universal_newlines=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise Failed(f"{what} did not finish in {timeout} s:\n{e.stdout or ''}")
    if p.returncode != 0:
        raise Failed(f"{what} failed (exit {p.returncode}):\n{p.stdout}")
    return p.stdout


def show(out):
    for line in out.rstrip("\n").split("\n"):
        print("  | " + line)


def main():
    env0 = dict(os.environ)
    source = env0["FA_SOURCE"]
    readme = env0.get("FA_README") or os.path.join(source, "README.md")
    prefix, libdir = env0["FA_PREFIX"], env0["FA_LIBDIR"]
    libdir = libdir if os.path.isabs(libdir) else os.path.join(prefix, libdir)
    # the build's compiler by its full path: `cc` below is a wrapper that calls it
    cc = shutil.which(env0["FA_CC"]) or env0["FA_CC"]
    sanitize = env0.get("FA_SANITIZE", "none")
    san_flags = [] if sanitize in ("", "none") else [f"-fsanitize={sanitize}"]

    blocks = parse(readme)
    markers = {b[3] for b in blocks if b[3]}
    problems = [f"marker 'skip {m}' in README.md is not listed in EXEMPT" for m in sorted(markers - set(EXEMPT))]
    problems += [f"EXEMPT lists '{m}' but README.md has no such marker" for m in sorted(set(EXEMPT) - markers)]
    c_blocks = [b for b in blocks if b[0] == "c"]
    if not c_blocks:
        problems.append("README.md has no ```c block (the other blocks build it as app.c)")
    if problems:
        print("\n".join(problems))
        return 1

    stage = tempfile.mkdtemp(prefix="flashattn-readme.")
    try:
        dest = os.path.join(stage, "dest")
        run([env0["FA_MESON"], "install", "-C", env0["FA_BUILD"], "--destdir", dest, "--no-rebuild", "--quiet"],
            None, env0, "meson install")
        dprefix, dlibdir = dest + prefix, dest + libdir
        # `cc` in the blocks is the build's compiler, with the build's sanitizer (its runtime first).
        bindir = os.path.join(stage, "bin")
        os.mkdir(bindir)
        with open(os.path.join(bindir, "cc"), "w") as f:
            f.write("#!/bin/sh\nexec %s %s \"$@\"\n" % (cc, " ".join(san_flags)))
        os.chmod(os.path.join(bindir, "cc"), 0o755)
        env = dict(env0)
        env.update(PATH=bindir + os.pathsep + env0.get("PATH", ""),
                   PKG_CONFIG_PATH=os.path.join(dlibdir, "pkgconfig"), PKG_CONFIG_SYSROOT_DIR=dest,
                   LD_LIBRARY_PATH=dlibdir + (os.pathsep + env0["LD_LIBRARY_PATH"] if env0.get("LD_LIBRARY_PATH") else ""),
                   FLASHATTN_BACKEND="cpu")
        env.pop("PKG_CONFIG_LIBDIR", None)
        app_c = c_blocks[0][1]
        have_pkgconfig = shutil.which("pkg-config") is not None

        def workdir(n):
            d = os.path.join(stage, f"block{n}")
            os.mkdir(d)
            with open(os.path.join(d, "app.c"), "w") as f:
                f.write(app_c)
            return d

        def run_app(d, what):
            out = run([os.path.join(d, "app")], d, env, what + ": ./app")
            show(out)
            if not out.startswith("success;"):
                raise Failed(what + ": ./app did not report success")

        passed, skipped, failed = [], [], []
        for n, (lang, text, line, exempt) in enumerate(blocks):
            what = f"README.md:{line} ```{lang}"
            if exempt:
                print(f"{what}: exempt ({exempt}: {EXEMPT[exempt]})")
                skipped.append(what + " (exempt)")
                continue
            print(f"{what}:")
            try:
                d = workdir(n)
                if lang == "c":
                    if not have_pkgconfig:
                        raise Failed("pkg-config is not installed (needed for the C block's flags)")
                    with open(os.path.join(d, "snippet.c"), "w") as f:
                        f.write(text)
                    flags = run(["pkg-config", "--cflags", "--libs", "flashattn"], d, env, "pkg-config").split()
                    run([cc, "-std=c11", "-Wall", "-Werror", "-o", "app", "snippet.c"] + san_flags + flags + ["-lm"],
                        d, env, what + ": compile")
                    run_app(d, what)
                elif lang == "cmake":
                    if env0.get("FA_CMAKE_PACKAGE") != "1" or not shutil.which("cmake"):
                        print(f"  SKIPPED: cmake was not found at configure time, so no CMake package is installed")
                        skipped.append(what + " (no CMake)")
                        continue
                    with open(os.path.join(d, "CMakeLists.txt"), "w") as f:
                        f.write("cmake_minimum_required(VERSION 3.13)\nproject(readme_snippet C)\n" + text)
                    run(["cmake", "-S", d, "-B", os.path.join(d, "b"), "-DCMAKE_PREFIX_PATH=" + dprefix,
                         "-DCMAKE_C_COMPILER=" + cc, "-DCMAKE_C_FLAGS=" + " ".join(san_flags),
                         "-DCMAKE_EXE_LINKER_FLAGS=" + " ".join(san_flags)], d, env, what + ": cmake configure")
                    run(["cmake", "--build", os.path.join(d, "b")], d, env, what + ": cmake build")
                    shutil.copy(os.path.join(d, "b", "app"), os.path.join(d, "app"))
                    run_app(d, what)
                elif lang == "sh":
                    if not have_pkgconfig:
                        print("  SKIPPED: pkg-config is not installed")
                        skipped.append(what + " (no pkg-config)")
                        continue
                    with open(os.path.join(d, "snippet.sh"), "w") as f:
                        f.write(text)
                    out = run(["sh", "-e", "snippet.sh"], d, env, what + ": sh -e")
                    show(out)
                    if os.path.exists(os.path.join(d, "app")):
                        run_app(d, what)
                elif lang == "meson":
                    with open(os.path.join(d, "meson.build"), "w") as f:
                        f.write("project('app', 'c')\n" + text)
                    opts = [] if not san_flags else ["-Db_sanitize=" + sanitize, "-Db_lundef=false"]
                    run([env0["FA_MESON"], "setup", os.path.join(d, "b"), d] + opts, d, env, what + ": meson setup")
                    run([env0["FA_MESON"], "compile", "-C", os.path.join(d, "b")], d, env, what + ": meson compile")
                    shutil.copy(os.path.join(d, "b", "app"), os.path.join(d, "app"))
                    run_app(d, what)
                elif lang == "python":
                    python = env0.get("FA_README_PYTHON") or sys.executable
                    probe = subprocess.run([python, "-c", "import numpy, flashattn"], cwd=d, env=env,
                                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True)
                    if probe.returncode != 0:
                        reason = (probe.stdout.strip().split("\n") or ["?"])[-1]
                        print(f"  SKIPPED: `import numpy, flashattn` fails with {python} ({reason}); run this test "
                              "with FA_README_PYTHON=<a python with the package installed> (pip install ., "
                              "or the venv of scripts/ci-python.sh with FA_PY_CI_DIR set)")
                        skipped.append(what + " (flashattn not importable)")
                        continue
                    with open(os.path.join(d, "snippet.py"), "w") as f:
                        f.write(text)
                    show(run([python, "snippet.py"], d, env, what + ": python"))
                else:
                    raise Failed(f"no handler for ```{lang}: add one to {os.path.basename(__file__)} "
                                 "or an explicit exemption")
                print("  OK")
                passed.append(what)
            except Failed as e:
                print(f"  FAILED: {e}")
                failed.append(what)
        print(f"readme_snippets: {len(passed)} passed, {len(failed)} failed, {len(skipped)} skipped")
        for what in skipped:
            print(f"  skipped: {what}")
        for what in failed:
            print(f"  FAILED: {what}")
        return 1 if failed else 0
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def python_only(readme):
    """--python: the README's python blocks with this interpreter, which must import flashattn
    (scripts/ci-python.sh runs it from the venv holding the installed wheel). No skips."""
    blocks = [b for b in parse(readme) if b[0] == "python"]
    if not blocks:
        print("readme_snippets --python: README.md has no ```python block")
        return 1
    failed = 0
    for lang, text, line, _ in blocks:
        d = tempfile.mkdtemp(prefix="flashattn-readme-py.")
        try:
            with open(os.path.join(d, "snippet.py"), "w") as f:
                f.write(text)
            show(run([sys.executable, "snippet.py"], d, dict(os.environ), f"README.md:{line} python"))
            print(f"README.md:{line} ```python: OK")
        except Failed as e:
            print(f"README.md:{line} ```python: FAILED: {e}")
            failed += 1
        finally:
            shutil.rmtree(d, ignore_errors=True)
    print(f"readme_snippets --python: {len(blocks) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--python"]:
        sys.exit(python_only(sys.argv[2] if len(sys.argv) > 2 else
                             os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "README.md")))
    sys.exit(main())
