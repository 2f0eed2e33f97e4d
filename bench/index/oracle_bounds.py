#!/usr/bin/env python3
"""What any index could do on one head of real calibration data: oracle
bounds for recall@k against keys scored (docs/performance.md, "How far graph
walks can go at 32K").

    python3 bench/index/oracle_bounds.py --calib DIR --layer L --head H \\
        [--graph PREFIX [--walks N]] [--queries 256] [--k 100]

Context = the keys of the first T - m tokens, test queries = the queries of
the last m tokens (the protocol of `rattn bench index --calib`). Prints one
JSON object:
  - score_gaps: median logit gaps (scores / sqrt(d)) between ranks 1, k, 2k,
    3k, 10k, 30k of the test queries: how close the k-th key is to the rest;
  - nearest_query_lists: the exact top-N key lists of the j training queries
    nearest (cosine) to each test query, found by an oracle scan: recall@k of
    their union and its size (the candidates such a method would score);
  - kmeans_probe: k-means (L2) cells of the keys probed in the order of their
    centroid's score: keys scored (centroids included) until 95% of the
    top-k is covered;
  - graph (with --graph PREFIX, written by `rattn bench index --dump-graph
    PREFIX` on the same head and data): a greedy set cover of 95% of each
    test query's top-k by neighbour lists, i.e. the least a walk scores when
    an oracle picks which nodes to expand (entries not counted), and the score
    ranks of those nodes (the walk that expands exactly the top-k is the
    bench's own answer_expansion_scored_fraction);
  - walks (with --graph and --walks N, every (m/N)-th test query): a walk
    with a key budget (it scores the entries, then expands one scored node at
    a time, its unscored neighbours all scored; the result is the best k of
    everything scored) in three expansion orders: the node's own score (what
    the search does), the score of the mean key of its list (known without
    scoring the list), and an oracle that knows which unscored neighbours are
    in the answer; recall@k at 2, 3, 4 and 5% of the keys scored.
Needs numpy (Debian python3-numpy or PyPI numpy); not part of the test suite.
"""
import argparse
import json

import numpy as np


def load_head(calib, layer, head, m):
    q = np.load(f"{calib}/layer_{layer}.q.npy", mmap_mode="r")
    k = np.load(f"{calib}/layer_{layer}.k.npy", mmap_mode="r")
    tokens, kv = k.shape[1], head // (q.shape[0] // k.shape[0])
    keys = np.asarray(k[kv, : tokens - m], dtype=np.float32)
    train = np.asarray(q[head, : tokens - m], dtype=np.float32)
    test = np.asarray(q[head, tokens - m :], dtype=np.float32)
    return keys, train, test


def top_ids(scores, k):
    part = np.argpartition(-scores, k - 1, axis=1)[:, :k]
    order = np.argsort(-np.take_along_axis(scores, part, 1), axis=1)
    return np.take_along_axis(part, order, 1)


def load_graph(prefix):
    """Neighbour lists and entry points written by `rattn bench index --dump-graph PREFIX`."""
    padded = np.load(f"{prefix}.lists.npy")
    return [row[row >= 0] for row in padded], np.load(f"{prefix}.entries.npy")


def greedy_cover(lists, reverse, answer, need):
    answer_set = set(answer.tolist())
    candidates = set()
    for key in answer_set:
        candidates.update(reverse[key])
    sets = {v: set(lists[v].tolist()) for v in candidates}
    covered, scored, chosen = set(), set(), []
    while len(covered) < need:
        best, best_ratio = None, -1.0
        for v, s in sets.items():
            gain = len((s & answer_set) - covered)
            if gain:
                ratio = gain / max(len(s - scored), 1)
                if ratio > best_ratio:
                    best, best_ratio = v, ratio
        if best is None:
            break
        covered |= sets[best] & answer_set
        scored |= sets[best]
        chosen.append(best)
    return len(scored), chosen


def budget_walk(lists, entries, priority, budgets):
    """The ids a walk has scored, in order, when it reaches each budget (a share of the keys)."""
    n = len(lists)
    scored = np.zeros(n, dtype=bool)
    order = []
    for e in entries:
        if not scored[e]:
            scored[e] = True
            order.append(int(e))
    candidates, snapshots = set(order), {}
    marks = sorted((int(b * n), b) for b in budgets)
    while marks and candidates:
        best = max(candidates, key=lambda v: priority(v, scored))
        candidates.discard(best)
        for u in lists[best]:
            if scored[u]:
                continue
            scored[u] = True
            order.append(int(u))
            candidates.add(int(u))
            while marks and len(order) >= marks[0][0]:
                snapshots[marks.pop(0)[1]] = np.array(order)
    return snapshots


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calib", required=True)
    ap.add_argument("--layer", type=int, required=True)
    ap.add_argument("--head", type=int, default=0)
    ap.add_argument("--queries", type=int, default=256)
    ap.add_argument("--k", type=int, default=100)
    ap.add_argument("--graph", help="prefix of `rattn bench index --dump-graph` files")
    ap.add_argument("--walks", type=int, default=0, help="test queries of the budget-walk simulation (0: none)")
    a = ap.parse_args()
    keys, train, test = load_head(a.calib, a.layer, a.head, a.queries)
    n, d, k = len(keys), keys.shape[1], a.k
    need = int(np.ceil(0.95 * k))
    scores = test @ keys.T
    ranked = np.sort(scores, axis=1)[:, ::-1] / np.sqrt(d)
    answer = top_ids(scores, k)
    out = {"layer": a.layer, "head": a.head, "keys": n, "test_queries": len(test), "k": k}
    out["score_gaps"] = {
        f"s{r0 + 1}-s{r1 + 1}": float(np.median(ranked[:, r0] - ranked[:, r1]))
        for r0, r1 in [(0, k - 1), (k - 1, 2 * k - 1), (k - 1, 3 * k - 1), (k - 1, 10 * k - 1), (k - 1, 30 * k - 1)]
        if r1 < n
    }

    unit = lambda x: x / np.linalg.norm(x, axis=1, keepdims=True)
    nearest = np.argsort(-(unit(test) @ unit(train).T), axis=1)[:, :16]
    rows = []
    for j in (1, 4, 16):
        for lst in (k, 2 * k, 4 * k):
            recall, size = [], []
            for i in range(len(test)):
                cand = np.unique(top_ids(train[nearest[i, :j]] @ keys.T, lst))
                recall.append(np.isin(answer[i], cand).mean())
                size.append(len(cand) / n)
            rows.append({"queries": j, "list": lst, "recall": float(np.mean(recall)),
                         "scored_fraction": float(np.mean(size))})
    out["nearest_query_lists"] = rows

    rng = np.random.default_rng(0)
    rows = []
    for cells in (128, 256, 512):
        centroids = keys[rng.choice(n, cells, replace=False)].copy()
        for _ in range(12):
            cell = ((keys * keys).sum(1)[:, None] - 2 * keys @ centroids.T + (centroids * centroids).sum(1)).argmin(1)
            for c in range(cells):
                members = cell == c
                if members.any():
                    centroids[c] = keys[members].mean(0)
        sizes = np.bincount(cell, minlength=cells)
        order = np.argsort(-(test @ centroids.T), axis=1)
        cost = []
        for i in range(len(test)):
            per_cell = np.bincount(cell[answer[i]], minlength=cells)
            reached = np.cumsum(per_cell[order[i]])
            probed = int(np.searchsorted(reached, need)) + 1
            cost.append((cells + sizes[order[i, :probed]].sum()) / n)
        rows.append({"cells": cells, "scored_fraction_for_95pct": float(np.median(cost))})
    out["kmeans_probe"] = rows

    if a.graph:
        lists, entries = load_graph(a.graph)
        if len(lists) != n:
            raise SystemExit(f"{a.graph}: {len(lists)} nodes, the data has {n} keys")
        reverse = [[] for _ in range(n)]
        for v, lst in enumerate(lists):
            for u in lst:
                reverse[u].append(v)
        rank = np.argsort(np.argsort(-scores, axis=1), axis=1)
        cover, expanded, ranks = [], [], []
        for i in range(len(test)):
            cost, chosen = greedy_cover(lists, reverse, answer[i], need)
            cover.append(cost / n)
            expanded.append(len(chosen))
            ranks += [int(rank[i, v]) for v in chosen]
        out["graph"] = {
            "mean_degree": float(np.mean([len(x) for x in lists])),
            "oracle_cover_scored_fraction": float(np.mean(cover)),
            "oracle_cover_expanded_nodes": float(np.mean(expanded)),
            "oracle_cover_node_rank_median": float(np.median(ranks)),
            "oracle_cover_nodes_in_top_k": float(np.mean(np.array(ranks) < k)),
        }

    if a.graph and a.walks > 0:
        budgets = (0.02, 0.03, 0.04, 0.05)
        centroids = np.stack([keys[lst].mean(0) if len(lst) else np.zeros(d, np.float32) for lst in lists])
        picked = np.linspace(0, len(test) - 1, a.walks).astype(int)
        rows = {}
        for name in ("own_score", "list_mean_key", "oracle_gain"):
            recalls = {b: [] for b in budgets}
            for i in picked:
                s, truth = scores[i], answer[i]
                in_answer = np.zeros(n, dtype=bool)
                in_answer[truth] = True
                list_score = centroids @ test[i]

                def priority(v, scored, name=name, s=s, in_answer=in_answer, list_score=list_score):
                    fresh = lists[v][~scored[lists[v]]]
                    if len(fresh) == 0:
                        return -np.inf
                    if name == "own_score":
                        return s[v]
                    if name == "list_mean_key":
                        return list_score[v]
                    return in_answer[fresh].mean() + 1e-9 * s[v]

                for b, ids in budget_walk(lists, entries, priority, budgets).items():
                    best = ids[np.argsort(-s[ids])[:k]]
                    recalls[b].append(np.isin(truth, best).mean())
            rows[name] = {f"{round(100 * b)}%": float(np.mean(r)) if r else None for b, r in recalls.items()}
        out["walks"] = {"queries": len(picked), "recall_at_scored_fraction": rows}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
