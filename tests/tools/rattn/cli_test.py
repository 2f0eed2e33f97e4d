#!/usr/bin/env python3
"""The rattn command line: --version, the exit codes (0 ok, 1 error, 2 usage,
3 target not met), options checked before work starts, and the DSL's limits
seen through `rattn inspect`.

usage: cli_test.py RATTN SOURCE_DIR CASE   (one ctest entry per CASE)
"""
import os
import re
import subprocess
import sys
import tempfile

RATTN, SOURCE, CASE = sys.argv[1], sys.argv[2], sys.argv[3]
MODEL = os.path.join(SOURCE, "models", "llama3-8b-262k.ra")
SMALL = 'model "M" { layers = 4; q_heads = 8; kv_heads = 2; head_dim = 128; context = 4096; }\n'


def run(*args, env=None, timeout=120):
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run([RATTN, *args], capture_output=True, text=True, env=e, timeout=timeout)


def expect(args, rc, needle=None, stream="stderr", **kw):
    r = run(*args, **kw)
    out = getattr(r, stream)
    assert r.returncode == rc, (args, "rc", r.returncode, "want", rc, r.stderr[-2000:])
    if needle is not None:
        assert needle in out, (args, "missing", needle, out[-2000:])
    return r


def write(tmp, name, text, mode="w"):
    path = os.path.join(tmp, name)
    with open(path, mode) as f:
        f.write(text)
    return path


def case_version():
    r = expect(["--version"], 0, stream="stdout")
    lines = r.stdout.splitlines()
    assert re.fullmatch(r"rattn \d+\.\d+\.\d+", lines[0]), lines
    assert re.fullmatch(r"Halide \d+\.\d+\.\d+", lines[1]), lines
    assert re.fullmatch(r"CUDA toolkit \d+\.\d+(\.\d+)*", lines[2]), lines
    assert re.fullmatch(r"git commit ([0-9a-f]{4,40}|unknown)", lines[3]), lines
    expect(["--help"], 0, "exit status: 0 ok, 1 error, 2 usage error", stream="stdout")


def case_usage_exits_2():
    for args, needle in [
        ([], "usage: rattn <command>"),
        (["frobnicate"], "unknown command 'frobnicate'"),
        (["inspect"], "rattn inspect: error: expects a FILE.ra"),
        (["inspect", MODEL, "--frobnicate"], "unknown option '--frobnicate'"),
        (["inspect", MODEL, "--context", "0"], "--context must be at least 1"),
        (["emit", MODEL], "--target must be 'halide', 'cuda' or 'library' (missing)"),
        (["emit", MODEL, "--target", "halide", "--frobnicate"], "unknown option '--frobnicate'"),
        (["emit", MODEL, "--target", "cuda", "--frobnicate"], "unknown option '--frobnicate'"),
        (["emit", "--target", "cuda", "--synthetic", "--layout", "diagonal"], "--layout must be"),
        (["emit", MODEL, "--target", "library", "--frobnicate"], "unknown option '--frobnicate'"),
        (["emit", MODEL, "--target", "library"], "missing -o OUT"),
        (["emit", MODEL, "--target", "library", "-o", "x", "--name", "--"], "has no letters or digits"),
        (["bench", "frobnicate"], "unknown benchmark 'frobnicate'"),
        (["bench", "index", "--frobnicate"], "unknown option '--frobnicate'"),
        (["bench", "kernels", "--frobnicate"], "unknown option '--frobnicate'"),
        (["bench", "decode", "--frobnicate"], "unknown option '--frobnicate'"),
        (["bench", "decode", "--tokens", "x"], "--tokens expects an integer"),
        (["bench", "decode", "--tokens"], "option '--tokens' expects a value"),
        (["bench", "decode", "--window"], "option '--window' expects a value"),
        (["tune", "--frobnicate"], "unknown option '--frobnicate'"),
        (["tune", "--plan", MODEL], "expects --plan FILE.ra and --calib DIR"),
        (["capture", "--frobnicate"], "unknown option '--frobnicate'"),
        (["capture"], "FILE is required"),
        (["eval"], "FILE is required"),
        (["eval", "--frobnicate"], "unknown option '--frobnicate'"),
    ]:
        expect(args, 2, needle)


def case_errors_exit_1():
    with tempfile.TemporaryDirectory() as tmp:
        expect(["inspect", os.path.join(tmp, "missing.ra")], 1, "cannot open the file")
        bad = write(tmp, "bad.ra", SMALL + "plan { top_k = ; }\n")
        expect(["inspect", bad], 1, "bad.ra:2:16: error: expected a number")
        expect(["emit", bad, "--target", "cuda"], 1, "bad.ra:2:16: error:")
    # Valid options the generator cannot serve: an error, not a usage error.
    expect(["emit", "--target", "cuda", "--synthetic", "--head-dim", "96"], 1, "head_dim 96 is not supported")
    # The deployable library: a bad arch, and no recorded runtime to link.
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "out")
        expect(["emit", MODEL, "--target", "library", "-o", out, "--gpu", "sm_1"], 1, "is not one of")
        expect(["emit", MODEL, "--target", "library", "-o", out, "--gpu", "none"], 1,
               "rattn_embed/link.txt is missing", env={"RATTN_LIB_DIR": tmp})
    for sub in (["inspect"], ["emit"], ["emit", "--target", "cuda"], ["emit", "--target", "library"], ["bench"], ["bench", "decode"], ["tune"],
                ["capture"], ["eval"]):
        expect(sub + ["--help"], 0, "usage: rattn", stream="stdout")


def case_emit_shape_overrides():
    for args, needle in [
        (["--synthetic", "--head-dim", "0"], "--head-dim must be at least 1 (got '0')"),
        (["--synthetic", "--head-dim", "-5"], "--head-dim must be at least 1 (got '-5')"),
        (["--synthetic", "--group-size", "-1"], "--group-size must be at least 1 (got '-1')"),
        (["--synthetic", "--group-size", "0"], "--group-size must be at least 1 (got '0')"),
        ([MODEL, "--head-dim", "0"], "--head-dim must be at least 1"),
        ([MODEL, "--group-size", "-1"], "--group-size must be at least 1"),
    ]:
        expect(["emit", "--target", "cuda", *args], 2, "rattn emit --target cuda: error: " + needle)
    # A given value still overrides the model's.
    r = expect(["emit", "--target", "cuda", "--synthetic", "--head-dim", "64", "--group-size", "2",
                "--layout", "contiguous"], 0, stream="stdout")
    assert "head_dim=64" in r.stdout or "_d64" in r.stdout, r.stdout[:2000]


def case_emit_cache_env():
    with tempfile.TemporaryDirectory() as tmp:
        cache = os.path.join(tmp, "cache")
        ptx = os.path.join(tmp, "k.ptx")
        expect(["emit", "--target", "cuda", "--synthetic", "--group-size", "2", "--layout", "contiguous",
                "--ptx", ptx], 0, env={"RATTN_CUDA_CACHE": cache}, timeout=300)
        assert os.path.getsize(ptx) > 0
        entries = [f for _, _, fs in os.walk(cache) for f in fs if f.endswith(".bin")]
        assert entries, "emit --ptx did not use $RATTN_CUDA_CACHE: " + str(list(os.walk(cache)))
        # --cache-dir wins over the variable.
        other = os.path.join(tmp, "other")
        expect(["emit", "--target", "cuda", "--synthetic", "--group-size", "2", "--layout", "contiguous",
                "--ptx", ptx, "--cache-dir", other], 0, env={"RATTN_CUDA_CACHE": cache}, timeout=300)
        assert [f for _, _, fs in os.walk(other) for f in fs if f.endswith(".bin")]


def case_tune_output_checked_first():
    # The calibration directory does not exist either: the output is checked first.
    for opt in ("-o", "--json"):
        r = expect(["tune", "--plan", MODEL, "--calib", "/nonexistent/calib", opt, "/nonexistent/x.ra"], 2,
                   "rattn tune: error: " + opt + " /nonexistent/x.ra: the directory /nonexistent does not exist")
    with tempfile.TemporaryDirectory() as tmp:
        expect(["tune", "--plan", MODEL, "--calib", "/nonexistent/calib", "-o", tmp], 2, "is a directory")


def case_tune_model_check_usage():
    gemma = os.path.join(SOURCE, "models", "gemma3-270m.ra")
    with tempfile.TemporaryDirectory() as tmp:
        text = os.path.join(tmp, "t.txt")
        with open(text, "w") as f:
            f.write("words\n")
        base = ["tune", gemma, "--synthetic", "-o", tmp]
        env = {"RATTN_GEMMA_GGUF": os.path.join(tmp, "absent.gguf")}
        expect(base + ["--model-check", "2"], 2, "--model-check needs --check-text FILE", env=env)
        expect(base + ["--check-text", text], 2, "--check-text needs --model-check N", env=env)
        expect(base + ["--model-check", "2", "--check-text", text, "--check-positions", "128"], 2,
               "128 checked positions cannot show an agreement of 0.990000 at confidence 0.950000", env=env)
        expect(base + ["--model-check", "2", "--check-text", text, "--check-tokens", "100",
                       "--check-positions", "200"], 2, "--check-tokens must exceed --check-positions", env=env)
        expect(base + ["--model-check", "2", "--check-text", os.path.join(tmp, "none.txt")], 1, "none.txt",
               env=env)


def case_bench_decode_help():
    r = expect(["bench", "decode", "--help"], 0, stream="stdout")
    lines = r.stdout.splitlines()
    i = next(n for n, l in enumerate(lines) if l.startswith("  --batch N"))
    # The --batch entry: its own continuation lines, then the next option.
    j = i + 1
    while lines[j].startswith("    "):
        j += 1
    assert lines[j].startswith("  --use-gpu"), lines[i:j + 1]
    assert "default 0: not run" in lines[j - 1], lines[i:j + 1]
    assert not any("plan's value" in l for l in lines[i:j]), lines[i:j]
    k = next(n for n, l in enumerate(lines) if l.startswith("  --search-seeds N"))
    assert "side by side with the plan's value" in lines[k + 1], lines[k:k + 3]


def case_inspect_kernel_knobs():
    with tempfile.TemporaryDirectory() as tmp:
        f = write(tmp, "w.ra", SMALL + "plan { kernel.cuda.warps = 3; }\n")
        expect(["inspect", f], 1, f + ":2:28: error: 'kernel.cuda.warps' must be 1, 2, 4 or 8, got 3")
        f = write(tmp, "u.ra", SMALL + "plan { kernel.foo.bar = 1; }\n")
        expect(["inspect", f], 1, f + ":2:8: error: unknown key 'kernel.foo.bar' in the plan block (expected one of: kernel.cuda.tile")
        f = write(tmp, "ok.ra", SMALL + "plan { kernel.cuda.warps = {4, 8}; kernel.halide.vector = 8..32 step *2; }\n")
        expect(["inspect", f], 0, stream="stdout")


def case_inspect_limits():
    with tempfile.TemporaryDirectory() as tmp:
        f = write(tmp, "bom.ra", "\ufeff" + SMALL, mode="w")
        with open(f, "rb") as fh:
            assert fh.read(3) == b"\xef\xbb\xbf"
        expect(["inspect", f], 0, stream="stdout")
        big = write(tmp, "big.ra", SMALL + "plan { top_k = {" + ", ".join(str(i) for i in range(1, 500001)) + "}; }\n")
        expect(["inspect", big], 1, big + ":1:1: error: the file is ", timeout=30)
        r = expect(["inspect", write(tmp, "num.ra", SMALL + "plan { top_k = " + "9" * 900000 + "; }\n")], 1, "999...")
        assert max(len(l) for l in r.stderr.splitlines()) < 200, r.stderr[:1000]


CASES = {k[len("case_"):]: v for k, v in globals().items() if k.startswith("case_")}
if CASE not in CASES:
    sys.exit("unknown case " + CASE + " (known: " + ", ".join(CASES) + ")")
CASES[CASE]()
print("ok", CASE)
