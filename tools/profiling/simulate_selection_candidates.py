"""A candidate filter before the causal selection's sort, simulated on the CPU (numpy).

Key j is ever kept iff fewer than w earlier keys outrank it (once w do, later queries only add
more). Any threshold tau(j) that never falls with j and stays at or below the w-th best score
among keys [0, j) keeps every such key among the candidates s_j >= tau(j); and every earlier key
that outranks a candidate is a candidate too, so a key the candidates' own walk finds kept
(fewer than w outranking candidates before it) is kept, and a kept key's interval end (the w-th
smallest index among the keys that outrank it) is the same over the candidates as over the row:
a key that is never kept and outranks a kept key j already has w keys before it that outrank it,
and so j, all at lower indices. So the sort and the walk (docs/performance.md, "selection") could
run over the candidates alone.

Here tau is the running maximum, over the chunks before j's, of the w-th best score in the `back`
chunks before each: one select a chunk, all independent. The script checks the intervals from
the candidates against the full computation and prints how many keys remain to sort.

Usage: python3 tools/profiling/simulate_selection_candidates.py [--seqlen 32768 --w 1024]
       [--chunk 2048 --back 8] [--scores normal|rising|falling]
"""
import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from simulate_dkdv_groups import causal_intervals  # noqa: E402


def thresholds(s, w, chunk, back):
    """tau per key: the running max over chunks of the w-th best score of the `back` chunks before."""
    n = len(s)
    tau = np.full(n, -np.inf, np.float32)
    run = -np.inf
    for c0 in range(0, n, chunk):
        window = s[max(0, c0 - back * chunk):c0]
        if len(window) >= w:
            run = max(run, np.partition(window, len(window) - w)[len(window) - w])
        tau[c0:c0 + chunk] = run
    return tau


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seqlen", type=int, default=32768)
    ap.add_argument("--w", type=int, default=1024)
    ap.add_argument("--chunk", type=int, default=2048)
    ap.add_argument("--back", type=int, default=8)
    ap.add_argument("--scores", default="normal", choices=["normal", "rising", "falling"])
    args = ap.parse_args()
    n, w = args.seqlen, args.w
    rng = np.random.default_rng(0)
    s = rng.standard_normal(n).astype(np.float32)
    if args.scores != "normal":  # a trend along the row, with noise
        trend = np.linspace(0, 8, n, dtype=np.float32)
        s = s + (trend if args.scores == "rising" else -trend)
    begin, end = causal_intervals(s, w)
    cand = np.nonzero(s >= thresholds(s, w, args.chunk, args.back))[0]
    _, end_c = causal_intervals(s[cand], w)  # the walk over the candidates, in their own positions
    # back to row indices: a candidate's end is the row index of the candidate at its end
    # position (n past the last), and never below the key itself
    ends = np.where(end_c >= len(cand), n, cand[np.minimum(end_c, len(cand) - 1)])
    ends = np.maximum(ends, cand)
    same = np.array_equal(ends, end[cand]) and np.all(end[np.setdiff1d(np.arange(n), cand)] == begin[np.setdiff1d(np.arange(n), cand)])
    kept = int((end > begin).sum())
    print(f"S {n}, w {w}, chunks of {args.chunk} looking back {args.back}, {args.scores} scores: kept {kept}, "
          f"candidates {len(cand)} ({len(cand) / n:.1%} of the row); intervals equal the full selection's: {same}")


if __name__ == "__main__":
    main()
