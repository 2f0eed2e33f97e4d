#!/usr/bin/env python3
"""`rattn bench decode --batch` and the GPU options of `rattn bench kernels`
end to end: the batch figures are in the JSON, a batched sequence's outputs
equal its one-by-one twin's at every step, the static set's placement is
reported, the input checks' cost is reported, and bad option values or a
memory need beyond the machine fail with a message before any work."""
import json
import subprocess
import sys

rattn = sys.argv[1]
cmd = [rattn, "bench", "decode", "--tokens", "3000", "--head-dim", "64", "--steps", "8", "--threads", "2",
       "--window", "64", "--sinks", "4", "--batch", "3", "--json"]
out = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
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
placement = out["params"]["static_set"]
assert "static set on the CPU kernels" in placement or "static set on the GPU" in placement, placement

for args, needle in ((["--gpu-splits", "0,99"], "--gpu-splits expects split counts in [-1, 64]"),
                     (["--gpu-tokens", "640,x"], "--gpu-tokens expects token counts"),
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
