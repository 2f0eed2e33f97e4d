#!/usr/bin/env python3
"""`rattn bench index` end to end on a small synthetic set: the JSON holds
every method, the timing rounds (--repeat) with the median reported, the
one-line code variant's shape, and a bad --search item fails with a message."""
import json
import statistics
import os
import subprocess
import sys
import tempfile

rattn = sys.argv[1]
cmd = [rattn, "bench", "index", "--synthetic", "3000", "--dim", "64", "--queries", "40", "--methods", "graph,flat",
       "--search", "codes@24+16,codes", "--budgets", "40,400", "--repeat", "3", "--insert-fraction", "0",
       "--interleave", "0", "--json", "--dump-graph", os.path.join(tempfile.mkdtemp(), "g")]
out = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
methods = {m["name"]: m for m in out["methods"]}
assert set(methods) == {"projected_graph", "exact_flat_scan"}, methods.keys()
graph = methods["projected_graph"]
assert graph["search"] == "codes@24+16"
for p in graph["points"]:
    rounds = p["us_per_query_rounds"]
    assert len(rounds) == 3 and all(r > 0 for r in rounds), p
    assert p["us_per_query"] == statistics.median(rounds), p
    assert 0 < p["recall"] <= 1 and 0 < p["scored_fraction"] <= 1, p
# A queue of 400 covers far more than the top 100 of 2960 keys: near-exact.
assert graph["points"][1]["recall"] > 0.97, graph["points"][1]
# The floor of the degree: the true top-100 plus their neighbour lists, of 2960 keys.
floor = graph["answer_expansion_scored_fraction"]
assert 100 / 2960 < floor < 1, floor
# The dumped lists: one padded row of slots per key of the 2960, and the entry points.
def npy_shape(path):
    with open(path, "rb") as f:
        head = f.read(128).decode("latin1")
    assert "'descr': '<i4'" in head, head
    return tuple(int(x) for x in head.split("'shape': (")[1].split(")")[0].split(",") if x.strip())
prefix = cmd[-1]
lists_shape = npy_shape(prefix + ".lists.npy")
assert lists_shape[0] == 2960 and lists_shape[1] >= 16, lists_shape
assert npy_shape(prefix + ".entries.npy")[0] >= 1
variant = graph["search_variants"][0]
assert variant["name"] == "codes" and variant["code_dims"] == 0 and variant["code_coarse_dims"] == 0, variant
assert graph["code_bytes_per_key"] >= 64, graph  # the one-line codes exist
flat = methods["exact_flat_scan"]["points"][0]
assert flat["recall"] == 1 and len(flat["us_per_query_rounds"]) == 3, flat
paired = graph["paired_with_flat"]
assert len(paired["speedup_rounds"]) == 3 and paired["speedup_vs_flat"] == statistics.median(paired["speedup_rounds"])

bad = subprocess.run([rattn, "bench", "index", "--synthetic", "3000", "--search", "codes@24+x"], capture_output=True,
                     text=True)
assert bad.returncode != 0 and "--search expects an integer, got 'x'" in bad.stderr, (bad.returncode, bad.stderr)
bad = subprocess.run([rattn, "bench", "index", "--synthetic", "3000", "--methods", "flat", "--dump-graph", prefix],
                     capture_output=True, text=True)
assert bad.returncode != 0 and "--dump-graph needs the graph method" in bad.stderr, (bad.returncode, bad.stderr)
print("ok")
# The decode step's insertion schedules (window:batch), each on a copy of one base graph: every
# token ends up inserted, so recall over all queries is near the hinted insert's.
cmd = [rattn, "bench", "index", "--synthetic", "3000", "--dim", "32", "--queries", "40", "--methods", "graph",
       "--search", "exact", "--budgets", "60", "--repeat", "1", "--interleave", "0", "--insert-fraction", "0.1",
       "--insert-schedule", "64:1,64:8", "--json"]
ins = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)["insert"]
sched = ins["decode_schedules"]
assert [(r["window"], r["insert_batch"]) for r in sched] == [(64, 1), (64, 8)], sched
for r in sched:
    assert r["insert_us_per_key"] > 0 and abs(r["recall_all"] - ins["hinted_recall_all"]) < 0.1, (r, ins)
bad = subprocess.run([rattn, "bench", "index", "--synthetic", "3000", "--insert-schedule", "64:0"],
                     capture_output=True, text=True)
assert bad.returncode != 0 and "--insert-schedule expects a window" in bad.stderr, (bad.returncode, bad.stderr)
# The baselines on the graph build's key transform (centred) and, labelled, on raw keys; the insert
# experiment's hnswlib both ways.
cmd = [rattn, "bench", "index", "--synthetic", "2000", "--dim", "32", "--queries", "20", "--methods", "hnsw,ivf",
       "--insert-fraction", "0.1", "--json"]
out = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
methods = {m["name"]: m for m in out["methods"]}
assert set(methods) == {"hnswlib_hnsw_ip", "hnswlib_hnsw_ip_raw_keys", "faiss_ivf_flat_ip", "faiss_ivf_flat_ip_raw_keys"}, methods.keys()
for name, m in methods.items():
    assert m["key_transform"] == ("raw" if name.endswith("_raw_keys") else "centred"), (name, m["key_transform"])
    assert all(0 < p["recall"] <= 1 and 0 < p["scored_fraction"] for p in m["points"]), name
assert out["parameters"]["graph_key_transform"] == "centred" and out["parameters"]["baseline_keys"] == "both"
runs = out["insert"]["baselines"]
assert [(r["method"], r["key_transform"]) for r in runs] == [("hnswlib_hnsw_ip", "centred"),
                                                             ("hnswlib_hnsw_ip_raw_keys", "raw")], runs
assert all(0 < p["recall_all"] <= 1 for r in runs for p in r["points"])
# With a query metric (--key-metric 2) the baselines get it (queries L^-1 q, keys L'k), and centred and raw keys beside.
cmd = [rattn, "bench", "index", "--synthetic", "2000", "--dim", "32", "--queries", "20", "--methods", "hnsw",
       "--key-metric", "2", "--insert-fraction", "0", "--json"]
out = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
got = [(m["name"], m["key_transform"]) for m in out["methods"]]
assert got == [("hnswlib_hnsw_ip", "query_metric_2"), ("hnswlib_hnsw_ip_centred_keys", "centred"),
               ("hnswlib_hnsw_ip_raw_keys", "raw")], got
assert out["parameters"]["graph_key_transform"] == "query_metric_2"
assert all(0 < p["recall"] <= 1 for m in out["methods"] for p in m["points"])
# The second distribution and the build sweep: builds on the first 1000 and 2000 keys with the partitioned
# training kNN forced on (--knn-min-keys 0), each reported with its kNN share and the exponent between them.
cmd = [rattn, "bench", "index", "--synthetic", "3000", "--distribution", "documents", "--dim", "32", "--queries", "40",
       "--methods", "graph", "--budgets", "100", "--repeat", "1", "--insert-fraction", "0", "--interleave", "0",
       "--knn-cluster-keys", "64", "--knn-probes", "4", "--knn-min-keys", "0", "--build-sizes", "1000,2000", "--json"]
out = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
assert out["data"]["distribution"] == "documents", out["data"]
assert out["parameters"]["knn_cluster_keys"] == 64 and out["parameters"]["knn_probes"] == 4
assert out["parameters"]["repair_fraction"] == 1 and out["parameters"]["repair_max_queries"] == 16384, out["parameters"]
graph = out["methods"][0]
assert graph["knn_partitions"] == 46 and 0 < graph["knn_scanned_fraction"] < 1, graph  # 2960 keys / 64
sizes = out["build_sweep"]["sizes"]
assert [s["keys"] for s in sizes] == [1000, 2000], sizes
assert [s["knn_partitions"] for s in sizes] == [15, 31], sizes
assert all(s["build_seconds"] > 0 and s["knn_seconds"] >= 0 for s in sizes), sizes
assert "exponent_wall" not in sizes[0] and "exponent_wall" in sizes[1] and "exponent_cpu" in sizes[1], sizes
for bad_args, message in [(["--distribution", "zipf"], "--distribution expects topics or documents"),
                          (["--build-sizes", "2000,1000"], "--build-sizes expects ascending sizes"),
                          (["--build-sizes", "5000"], "is more than the"),
                          (["--knn-probes", "-1"], "--knn-probes expects an integer in [0, 2147483647], got '-1'"),
                          (["--build-sizes", "8"], "--build-sizes expects an integer >= 16, got '8'"),
                          (["--shared-graph", "65"], "--shared-graph expects an integer in [0, 64], got '65'")]:
    bad = subprocess.run([rattn, "bench", "index", "--synthetic", "3000", "--methods", "flat", "--insert-fraction", "0"]
                         + bad_args, capture_output=True, text=True)
    assert bad.returncode != 0 and message in bad.stderr, (bad_args, bad.returncode, bad.stderr)
print("ok")
