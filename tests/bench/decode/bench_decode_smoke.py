#!/usr/bin/env python3
"""`rattn bench decode --batch` and the GPU options of `rattn bench kernels`
end to end: the JSON alone on stdout and the progress as plain lines on
stderr (not a terminal), the batch figures are in the JSON, a batched sequence's outputs
equal its one-by-one twin's at every step, the static set's placement is
reported, the input checks' cost is reported, and bad option values or a
memory need beyond the machine fail with a message before any work."""
import json
import re
import subprocess
import sys
import time

rattn = sys.argv[1]


def run_json(cmd, label):
    """Runs cmd with stdout and stderr pipes (not terminals): stdout is the
    JSON alone, stderr holds the progress as a few plain lines (one at the
    start, one at most every 10 s, the last at 100%)."""
    t0 = time.monotonic()
    r = subprocess.run(cmd, check=True, capture_output=True, text=True)
    seconds = time.monotonic() - t0
    assert "\r" not in r.stderr and "\033" not in r.stderr, r.stderr
    lines = [l for l in r.stderr.splitlines() if re.match(re.escape(label) + r": +\d+% \(", l)]
    assert lines and re.match(re.escape(label) + r": 100% ", lines[-1]), r.stderr
    assert len(lines) <= 2 + seconds / 10, (seconds, lines)
    shares = [int(re.match(re.escape(label) + r": +(\d+)%", l).group(1)) for l in lines]
    assert shares == sorted(shares), lines
    return json.loads(r.stdout)


small = [rattn, "bench", "decode", "--tokens", "3000", "--head-dim", "64", "--steps", "8", "--threads", "2",
         "--window", "64", "--sinks", "4"]
# One insertion per step (--insert-batch 1), so that the per-step counts below are exact.
cmd = small + ["--batch", "3", "--insert-batch", "1", "--json"]
out = run_json(cmd, "rattn bench decode")
assert out["params"]["batch"] == 3, out["params"]
batch = out["results"]["batch"]
assert batch["sequences"] == 3, batch
assert batch["steps_with_different_outputs"] == 0, batch
for key in ("one_by_one_ms_median", "batch_ms_median", "speedup_median", "batch_cpu_ms_amortised"):
    assert batch[key] > 0, (key, batch)
# The input checks' cost, as a share of the step and of the prefill.
results = out["results"]
assert 0 < results["input_check_us_per_step"] and 0 < results["input_check_share_of_step"] < 1, results
assert 0 < results["prefill_input_check_s"] and 0 < results["prefill_input_check_share"] < 1, results
# The roofline: every part of the step, bytes from the profile's counts.
roof = results["roofline"]
assert roof["triad_gb_s_1thread"] > 0 and roof["threads"] == 2, roof
phases = {p["phase"]: p for p in roof["phases"]}
assert list(phases) == ["static set", "search", "retrieved attention", "merge", "insertion", "full attention"], phases
counts = roof["counts_per_step"]
# Per step: the 4 sinks + 64 window rows of the static set, the top-100 of each of the 4 query
# heads, one merge per head, one insertion per head's index.
assert (counts["static_rows"], counts["retrieved_rows"], counts["merged_partials"], counts["inserted"]) == \
    (68, 400, 4, 4), counts
assert counts["insert_keys_scored"] > 0 and phases["insertion"]["bytes_per_step"] > 0, (counts, phases)
assert phases["static set"]["bytes_per_step"] == counts["static_rows"] * 2 * 64 * 2 > 0, (phases, counts)
assert phases["retrieved attention"]["bytes_per_step"] == counts["retrieved_rows"] * 2 * 64 * 2 > 0, (phases, counts)
assert counts["keys_scored"] > 0 and phases["search"]["gb_s"] > 0, (phases, counts)
# Full attention at step s reads 3000 + warmup + s + 1 rows of K and V.
rows = 3000 + out["params"]["warmup"] + (8 + 1) / 2
assert abs(phases["full attention"]["bytes_per_step"] - rows * 2 * 64 * 2) < 1e-6, phases
placement = out["params"]["static_set"]
assert "static set on the CPU kernels" in placement or "static set on the GPU" in placement, placement

# With --shared-graph 1 the group's query heads search one graph, so a decoded token is
# inserted once per step, not once per query head; the outputs stay close to full attention.
shared = run_json(small + ["--shared-graph", "1", "--json"], "rattn bench decode")
assert shared["params"]["shared_graph"] is True and out["params"]["shared_graph"] is False, shared["params"]
shared_counts = shared["results"]["roofline"]["counts_per_step"]
assert shared_counts["inserted"] == 1 and shared_counts["retrieved_rows"] == 400, shared_counts
# Without --insert-batch: the runtime's default batch (16), cut to the 8 steps so that the
# amortised figures cover a whole batch period; its 8 insertions still average 1 per step.
assert shared["params"]["insert_batch"] == 8 and out["params"]["insert_batch"] == 1, shared["params"]
assert shared["results"]["mean_cosine_rattn_vs_full"] > 0.99, shared["results"]["mean_cosine_rattn_vs_full"]

# An exact top-k scan in place of the graph: what the plan's top-k allows at
# best, so its cosine is no lower than the graph's (the same steps and data).
exact = run_json(small + ["--index", "exact", "--json"], "rattn bench decode")
assert exact["params"]["index"] == "exact" and out["params"]["index"] == "graph", (exact["params"], out["params"])
# The scan scores every offloaded key for each query head; the graph far fewer.
ec = exact["results"]["roofline"]["counts_per_step"]
offloaded = ec["full_attention_rows"] - ec["static_rows"]
assert abs(ec["keys_scored"] - exact["params"]["group"] * offloaded) < 1, (ec, exact["params"]["group"])
assert out["results"]["roofline"]["counts_per_step"]["keys_scored"] < ec["keys_scored"], out["results"]["roofline"]
assert exact["results"]["mean_cosine_rattn_vs_full"] >= out["results"]["mean_cosine_rattn_vs_full"] - 1e-4, \
    (exact["results"]["mean_cosine_rattn_vs_full"], out["results"]["mean_cosine_rattn_vs_full"])

# bench kernels reports full attention against the same run's triad.
kern = run_json([rattn, "bench", "kernels", "--no-jit", "--full-tokens", "2048", "--min-time", "0.01", "--json"],
                "rattn bench kernels")
fa = kern["full_attention"]
assert fa["bytes"] == 2048 * 2 * 128 * 2 and fa["gb_s_1thread"] > 0 and fa["gb_s_2threads"] > 0, fa
assert abs(fa["share_of_1thread_triad"] - fa["gb_s_1thread"] / kern["memory_bandwidth"]["triad_gb_s_1thread"]) < 1e-9, fa
assert abs(fa["scaling_2threads"] - fa["gb_s_2threads"] / fa["gb_s_1thread"]) < 1e-9, fa
# The median runs beside the fastest: never faster than it.
assert 0 < fa["gb_s_1thread_median"] <= fa["gb_s_1thread"] and 0 < fa["gb_s_2threads_median"] <= fa["gb_s_2threads"], fa
bw = kern["memory_bandwidth"]
assert 0 < bw["triad_gb_s_1thread_median"] <= bw["triad_gb_s_1thread"], bw
assert abs(fa["share_of_1thread_triad_median"] - fa["gb_s_1thread_median"] / bw["triad_gb_s_1thread_median"]) < 1e-9, fa
two = [r for r in kern["results"] if r["impl"].startswith("halide 2 threads")]
assert len(two) == 1 and two[0]["max_rel_diff_vs_scalar"] < 1e-5, two
# The streaming dense kernel from 1 MiB of K + V: the 2048-token call uses it,
# the 2-thread run's 1024-token halves the cached kernel; they agree.
kern = run_json([rattn, "bench", "kernels", "--no-jit", "--full-tokens", "2048", "--min-time", "0.01",
                 "--stream-vector", "32", "--stream-mib", "1", "--json"], "rattn bench kernels")
fa = kern["full_attention"]
assert "_v32_s4096_" in fa["kernel_1thread"] and fa["kernel_2threads"] != fa["kernel_1thread"], fa
two = [r for r in kern["results"] if r["impl"].startswith("halide 2 threads")]
assert len(two) == 1 and two[0]["max_rel_diff_vs_scalar"] < 1e-5, two
full = [r for r in kern["results"] if r["kernel"] == "dense_attention" and r["impl"] == "halide" and r["tokens"] == 2048]
assert len(full) == 1 and full[0]["max_rel_diff_vs_scalar"] < 1e-5, full

for args, needle in ((["--gpu-splits", "0,99"], "--gpu-splits expects split counts in [-1, 64]"),
                     (["--gpu-tokens", "640,x"], "--gpu-tokens expects token counts"),
                     (["--stream-mib", "-1"], "--stream-mib expects an integer"),
                     (["--full-tokens", "1000", "--gpu-tokens", "2000"], "--gpu-tokens: 2000 is beyond --full-tokens")):
    bad = subprocess.run([rattn, "bench", "kernels"] + args, capture_output=True, text=True)
    assert bad.returncode != 0 and needle in bad.stderr, (args, bad.returncode, bad.stderr)
# More memory than any machine has: refused up front, saying how much.
huge = subprocess.run([rattn, "bench", "decode", "--tokens", "2147483648"], capture_output=True, text=True, timeout=60)
assert huge.returncode == 1 and "bench decode at 2147483648 tokens needs" in huge.stderr and "TiB" in huge.stderr, \
    (huge.returncode, huge.stderr)
bad = subprocess.run([rattn, "bench", "decode", "--batch", "-1"], capture_output=True, text=True)
assert bad.returncode != 0 and "--batch" in bad.stderr, (bad.returncode, bad.stderr)
print("ok")
