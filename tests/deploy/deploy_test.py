#!/usr/bin/env python3
"""The deployable library end to end.

usage: deploy_test.py RATTN_BINARY SOURCE_DIR WORK_DIR [CMAKE]

1. `rattn emit tests/deploy/tiny.ra --target library -o WORK/out --gpu sm_90`.
2. Checks the files, and that the library exports only rattn_* symbols.
3. Builds tests/deploy (a separate CMake project: find_package(rattn_tiny_deploy)
   with CMAKE_PREFIX_PATH=WORK/out) and a second copy of the program with the
   pkg-config file.
4. Runs both with RATTN_DISABLE_JIT=1, PATH=/nonexistent (no compiler) and
   empty kernel caches: the kernels must come from the embedded host set
   (deploy_test checks rattn_context_info.cpu_kernels), the outputs must
   match float64 full attention, and the caches must stay empty.
5. The same with RATTN_CPU_KERNELS=baseline: the embedded baseline set.
"""
import os
import shutil
import subprocess
import sys

NAME = "tiny_deploy"


def run(cmd, env=None, timeout=600):
    r = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)
    print("$ " + " ".join(cmd))
    print(r.stdout[-6000:])
    assert r.returncode == 0, ("exit status", r.returncode, cmd)
    return r.stdout


def bare_env(work, extra=None):
    """No compiler on PATH, no JIT, empty caches, nothing inherited."""
    caches = {k: os.path.join(work, "empty-" + k.lower()) for k in ("RATTN_CACHE_DIR", "RATTN_CUDA_CACHE", "HOME")}
    for d in caches.values():
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
    env = {"PATH": "/nonexistent", "RATTN_DISABLE_JIT": "1", **caches}
    env.update(extra or {})
    return env, caches


def check_caches_empty(caches):
    for k, d in caches.items():
        left = [os.path.join(r, f) for r, _, fs in os.walk(d) for f in fs]
        assert not left, (k, "was written to", left[:5])


def main():
    rattn, src, work = sys.argv[1], sys.argv[2], sys.argv[3]
    cmake = sys.argv[4] if len(sys.argv) > 4 else "cmake"
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    out = os.path.join(work, "out")
    text = run([rattn, "emit", os.path.join(src, "tests/deploy/tiny.ra"), "--target", "library", "-o", out,
                "--gpu", "sm_90"])
    lib = os.path.join(out, "lib", "lib" + "rattn_" + NAME + ".so")
    for f in [lib, os.path.join(out, "include", "rattn.h"),
              os.path.join(out, "lib", "cmake", "rattn_" + NAME, "rattn_" + NAME + "Config.cmake"),
              os.path.join(out, "lib", "pkgconfig", "rattn_" + NAME + ".pc")]:
        assert os.path.isfile(f), ("missing", f)
    assert "host (" in text and "baseline (" in text, "both kernel sets"
    assert "GPU modules: 1" in text, "one CUDA module (sm_90)"
    # The progress bar, as plain lines without a terminal (stderr is merged here).
    assert "rattn emit: 100% (" in text and "\r" not in text, "the progress lines"
    with open(os.path.join(src, "include", "rattn.h")) as a, open(os.path.join(out, "include", "rattn.h")) as b:
        assert a.read() == b.read(), "OUT/include/rattn.h is not include/rattn.h"

    # Only the C API is exported (the version script of librattn).
    syms = run(["nm", "-D", "--defined-only", lib])
    exported = [l.split()[-1] for l in syms.splitlines() if len(l.split()) >= 3]
    bad = [s for s in exported if not s.startswith("rattn_")]
    assert exported and not bad, ("exported beyond rattn_*", bad[:10])
    assert "rattn_context_create" in exported

    # A separate CMake project finds the package.
    build = os.path.join(work, "build")
    run([cmake, "-S", os.path.join(src, "tests/deploy"), "-B", build, "-DCMAKE_BUILD_TYPE=Release",
         "-DCMAKE_PREFIX_PATH=" + out, "-DRATTN_DEPLOY_NAME=" + NAME])
    run([cmake, "--build", build])
    binaries = [os.path.join(build, "deploy_test")]
    # pkg-config: its Libs carry the rpath.
    if shutil.which("pkg-config"):
        env = dict(os.environ, PKG_CONFIG_PATH=os.path.join(out, "lib", "pkgconfig"))
        flags = subprocess.run(["pkg-config", "--cflags", "--libs", "rattn_" + NAME], env=env, check=True,
                               stdout=subprocess.PIPE, text=True).stdout.split()
        exe = os.path.join(work, "deploy_test_pc")
        run(["cc", "-O1", os.path.join(src, "tests/deploy/deploy_test.c"), "-o", exe, *flags, "-lm"])
        binaries.append(exe)

    for exe in binaries:
        for preference, expected in [(None, "halide embedded:host"), ("baseline", "halide embedded:baseline")]:
            env, caches = bare_env(work, {"RATTN_CPU_KERNELS": preference} if preference else None)
            got = run([exe, expected], env=env)
            assert "PASS" in got
            check_caches_empty(caches)
            if preference == "baseline":
                # The forced choice is no failure: nothing is said about missing features.
                assert "does not run on this CPU" not in got, got
    print("deploy test: OK")


if __name__ == "__main__":
    main()
