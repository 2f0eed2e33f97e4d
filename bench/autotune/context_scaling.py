#!/usr/bin/env python3
"""How the price of a recall target grows with the context: reads the JSON of
`rattn tune` runs at several contexts (`--context N`, or captures of N
tokens) and prints, per layer and context, the keys the chosen setting
scores per search (absolute and as a share of the keys indexed), the best
recall at <= --share of the keys, and a least-squares fit
keys = a * N^alpha over the contexts (docs/performance.md, "How the price of
recall 0.95 scales with the context").

    python3 bench/autotune/context_scaling.py tune-4096.json tune-8192.json ... [--share 0.03]

Needs only the standard library; not part of the test suite.
"""
import argparse
import json
import math


def fit_power(xs, ys):
    lx, ly = [math.log(x) for x in xs], [math.log(y) for y in ys]
    mx, my = sum(lx) / len(lx), sum(ly) / len(ly)
    sxx = sum((x - mx) ** 2 for x in lx)
    alpha = sum((x - mx) * (y - my) for x, y in zip(lx, ly)) / sxx
    return math.exp(my - alpha * mx), alpha


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--share", type=float, default=0.03)
    args = ap.parse_args()
    rows = {}
    for path in args.runs:
        run = json.load(open(path))
        for layer in run["layers"]:
            n, chosen = layer["keys"], layer["chosen"]
            within = [t["recall"] for t in layer["trials"] if t["scored_fraction"] <= args.share]
            rows.setdefault(layer["layer"], []).append({
                "context": n + run["test_queries"],
                "keys": n,
                "met": layer["met"],
                "recall": chosen["recall"],
                "scored_share": chosen["scored_fraction"],
                "scored_keys": chosen["scored_fraction"] * n,
                "best_recall_within_share": max(within) if within else None,
            })
    out = {"min_recall": run["min_recall"], "share": args.share, "layers": {}}
    for layer, pts in sorted(rows.items()):
        pts.sort(key=lambda p: p["context"])
        met = [p for p in pts if p["met"]]
        entry = {"points": pts}
        if len(met) >= 2:
            a, alpha = fit_power([p["keys"] for p in met], [p["scored_keys"] for p in met])
            entry["fit"] = {"a": a, "alpha": alpha}
            # Where the fitted price falls to the share: a * N^alpha = share * N.
            entry["fit"]["keys_where_share_is_met"] = (a / args.share) ** (1 / (1 - alpha)) if alpha < 1 else None
        out["layers"][str(layer)] = entry
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
