"""Where the selection's walk spends its steps (select_walk.cuh), simulated on the CPU (numpy).

The walk takes a row's rank order 32 keys a step; a step's work grows with its hits, the keys
whose index lies below x (the w-th smallest index ranked before them). A hit is exactly a kept
key ranked at w or later, so the hits come from the intervals (simulate_dkdv_groups): a random
row's hits crowd just past rank w, where x is still high. A step with hits runs two loops over
its candidates, the set's nd = min(w - 1, nh) largest indices below x and its nh hits, a few
ballots each; this script weighs a step as 1 without hits and 3 + nd + nh with them, and
prints that weight per piece (a CTA's positions) for the pieces the walk would cut.

Usage: python3 tools/profiling/simulate_walk_pieces.py [--seqlen 32768 --w 1024 --piece 64]
"""
import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from simulate_dkdv_groups import causal_intervals  # noqa: E402


def step_hits(scores, w):
    """Hits per 32-position step of the rank order (ties: lower index first)."""
    n = len(scores)
    begin, end = causal_intervals(scores, w)
    order = np.lexsort((np.arange(n), -scores))
    kept = end[order] > begin[order]
    hits = kept & (np.arange(n) >= w)  # the first w ranked are kept to the end without a walk
    padded = np.zeros((n + 31) // 32 * 32, bool)
    padded[:n] = hits
    return padded.reshape(-1, 32).sum(1)


def piece_weights(nh, w, piece):
    nd = np.minimum(w - 1, nh)
    cost = np.where(nh == 0, 1, 3 + nd + nh)
    steps = piece // 32
    padded = np.zeros((len(cost) + steps - 1) // steps * steps, np.int64)
    padded[:len(cost)] = cost
    return padded.reshape(-1, steps).sum(1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seqlen", type=int, default=32768)
    ap.add_argument("--w", type=int, default=1024)
    ap.add_argument("--piece", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    nh = step_hits(np.random.default_rng(a.seed).standard_normal(a.seqlen), a.w)
    weights = piece_weights(nh, a.w, a.piece)
    walked = weights[a.w // a.piece:]  # pieces wholly before rank w do not walk
    heavy = np.argsort(-weights)[:6]
    print(f"Sk {a.seqlen} w {a.w}: {int(nh.sum())} hits in {int((nh > 0).sum())} of {len(nh)} steps")
    print(f"pieces of {a.piece}: heaviest {int(weights.max())} (piece {int(weights.argmax())}), "
          f"median of the walking pieces {float(np.median(walked)):.0f}")
    print("heaviest pieces (index, weight):", [(int(i), int(weights[i])) for i in heavy])


if __name__ == "__main__":
    main()
