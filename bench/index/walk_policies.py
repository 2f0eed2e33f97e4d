#!/usr/bin/env python3
"""Which expansion rule and which neighbour lists would let a graph walk
score fewer keys for the same recall@k on one head of real calibration data
(docs/performance.md, "Expansion rules and list contents at 32K").

    python3 bench/index/walk_policies.py --calib DIR --layer L --head H --graph PREFIX \\
        [--queries 256] [--walks 32] [--k 100] [--cooc-slots 16]

PREFIX: the graph of `rattn bench index --dump-graph PREFIX` on the same head
and data. Protocol of `rattn bench index --calib`: keys of the first T - m
tokens, test queries the last m; each walk is seeded with the previous test
query's exact top-k (the decode step seeds with the previous results) and the
graph's entries, all scored. A beam walk keeps the best L scored keys; it
expands, one at a time, the pool member of highest priority that has
neighbours left; its result is the pool's best k. Rules:
  - whole: every expansion scores the node's whole list (the search's default);
  - partial C:F: a node expanded below rank F of the pool scores its first C
    neighbours only, never the rest (SearchParams::expand_first /
    full_expand_rank);
  - chunked C/c: a node scores its first C neighbours, then c more at a time
    for as long as the best of its last chunk reaches the pool's k-th best
    score; its priority is then that chunk's mean score (known: just scored).
Lists: the dumped graph's, and (--cooc-slots S > 0) the same with its first
S slots given to the keys that most often share a training query's exact
top-k list with the node (the rest filled from the graph's list, in order).
Prints one JSON object: recall@k and the share of keys scored per rule and L.
Needs numpy; not part of the test suite.
"""
import argparse
import bisect
import json

import numpy as np

from oracle_bounds import load_graph, load_head, top_ids


def beam_walk(lists, starts, scores, pool_size, first, chunk, full_rank, k):
    """Returns (the pool's ids best first, keys scored). chunk == 0: no continuation."""
    n = len(lists)
    seen = np.zeros(n, dtype=bool)
    pool, priority, next_chunk = [], {}, {}
    scored = 0

    def score(u):
        nonlocal scored
        seen[u] = True
        scored += 1
        item = (-float(scores[u]), u)
        if len(pool) < pool_size or item < pool[-1]:
            bisect.insort(pool, item)
            priority[u], next_chunk[u] = float(scores[u]), 0
            if len(pool) > pool_size:
                pool.pop()

    for e in starts:
        if not seen[e]:
            score(int(e))
    while True:
        best, best_priority, rank = None, -np.inf, -1
        for r, (_, v) in enumerate(pool):
            if next_chunk[v] >= 0 and priority[v] > best_priority:
                best, best_priority, rank = v, priority[v], r
        if best is None:
            break
        lst, j = lists[best], next_chunk[best]
        if j == 0 and (first == 0 or (full_rank and rank < full_rank)):
            lo, hi = 0, len(lst)
        elif j == 0:
            lo, hi = 0, first
        else:
            lo = first + (j - 1) * chunk
            hi = lo + chunk
        part = lst[lo:hi]
        for u in part:
            if not seen[u]:
                score(int(u))
        k_th = -pool[min(len(pool), k) - 1][0]
        if chunk and hi < len(lst) and len(part) and float(scores[part].max()) >= k_th:
            next_chunk[best] = j + 1
            priority[best] = float(scores[part].mean())
        else:
            next_chunk[best] = -1
    return np.array([v for _, v in pool]), scored


def cooccurrence_lists(lists, keys, train, k, slots):
    """Each list with its first `slots` entries the keys most often in a training query's top-k with the node."""
    n = len(keys)
    members = np.concatenate([top_ids(train[i:i + 2048] @ keys.T, k) for i in range(0, len(train), 2048)])
    order = np.argsort(members.ravel(), kind="stable")
    starts = np.searchsorted(members.ravel()[order], np.arange(n + 1))
    rows_of = order // k  # training queries holding each key, grouped by key
    out = []
    for v in range(n):
        rows = rows_of[starts[v]:starts[v + 1]]
        ids, counts = np.unique(members[rows].ravel(), return_counts=True)
        keep = ids != v
        ids, counts = ids[keep], counts[keep]
        top = list(ids[np.argsort(-counts, kind="stable")[:slots]])
        have = set(top)
        for u in lists[v]:
            if len(top) >= len(lists[v]):
                break
            if u not in have:
                top.append(int(u))
                have.add(int(u))
        out.append(np.array(top, dtype=np.int64))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calib", required=True)
    ap.add_argument("--layer", type=int, required=True)
    ap.add_argument("--head", type=int, default=0)
    ap.add_argument("--graph", required=True, help="prefix of `rattn bench index --dump-graph` files")
    ap.add_argument("--queries", type=int, default=256)
    ap.add_argument("--walks", type=int, default=32, help="test queries walked (every (m/N)-th)")
    ap.add_argument("--k", type=int, default=100)
    ap.add_argument("--cooc-slots", type=int, default=16)
    a = ap.parse_args()
    keys, train, test = load_head(a.calib, a.layer, a.head, a.queries)
    lists, entries = load_graph(a.graph)
    if len(lists) != len(keys):
        raise SystemExit(f"{a.graph}: {len(lists)} nodes, the data has {len(keys)} keys")
    n, k = len(keys), a.k
    scores = test @ keys.T
    answer = top_ids(scores, k)
    picked = np.linspace(1, len(test) - 1, a.walks).astype(int)
    graphs = [("graph", lists)]
    if a.cooc_slots > 0:
        graphs.append((f"cooc{a.cooc_slots}+graph", cooccurrence_lists(lists, keys, train, k, a.cooc_slots)))
    rules = [("whole", 0, 0, 0, (100, 150, 200, 300)),
             ("partial 12:25", 12, 0, 25, (150, 200, 300)),
             ("partial 8:50", 8, 0, 50, (150, 200, 300)),
             ("chunked 4/4", 4, 4, 0, (150, 200, 300)),
             ("chunked 8/4", 8, 4, 0, (150, 200, 300))]
    rows = []
    for graph_name, g in graphs:
        for rule, first, chunk, full_rank, pools in rules:
            for pool_size in pools:
                recall, share = [], []
                for i in picked:
                    starts = list(entries) + list(answer[i - 1])
                    ids, scored = beam_walk(g, starts, scores[i], pool_size, first, chunk, full_rank, k)
                    recall.append(np.isin(answer[i], ids[:k]).mean())
                    share.append(scored / n)
                rows.append({"lists": graph_name, "rule": rule, "queue": pool_size,
                             "recall": round(float(np.mean(recall)), 4),
                             "scored_fraction": round(float(np.mean(share)), 5)})
    print(json.dumps({"layer": a.layer, "head": a.head, "keys": n, "walks": len(picked), "k": k, "rows": rows},
                     indent=1))


if __name__ == "__main__":
    main()
