"""Load balance of the dynamic-mask dk/dv kernel, simulated on the CPU (numpy): the causal
top-w selection of random scores (key j is kept by queries [j, end_j) while fewer than w
visible keys outrank it, ties to the lower index), then the kernel's grouping: windows of 256
kept keys ranked by interval end, groups of 64 keys, each walking the 32-query tiles its
keys span for each of the G query heads. Prints the share of computed pairs that are kept
pairs, and the longest CTA against the average per CTA slot (docs/perf-notes.md).

Usage: python3 bench/simulate_dkdv_groups.py
"""
import numpy as np

S, W = 16384, 2048  # as in bench_dma_causal.py: B1, Hk 4 KV heads of G 4 query heads each
HK, G = 4, 4
WINDOW, GROUP = 256, 64  # kBwdWindow, kBwdBlockN


def causal_intervals(scores, w):
    """Key j is kept by queries [j, end_j): until w visible keys outrank it (ties: lower index)."""
    n = len(scores)
    begin, end = np.arange(n), np.zeros(n, np.int64)
    for c0 in range(0, n, 512):
        idx = np.arange(c0, min(c0 + 512, n))
        sj = scores[idx, None]
        higher = (scores[None, :] > sj) | ((scores[None, :] == sj) & (np.arange(n)[None, :] < idx[:, None]))
        reach = np.cumsum(higher, axis=1) >= w
        end[idx] = np.maximum(np.where(reach.any(1), reach.argmax(1), n), idx)
    return begin, end


def group_spans(begin, end, block_m):
    """(lo, hi) query range walked by each CTA's group of keys, in block_m tiles."""
    kept = np.nonzero(end > begin)[0]
    for w0 in range(0, len(kept), WINDOW):
        win = kept[w0:w0 + WINDOW]
        order = sorted(range(len(win)), key=lambda i: (-end[win[i]], i))
        for g0 in range(0, len(win), GROUP):
            grp = win[order[g0:g0 + GROUP]]
            yield begin[grp].min() // block_m * block_m, end[grp].max()


def main():
    scores = np.random.default_rng(0).standard_normal(S).astype(np.float32)
    begin, end = causal_intervals(scores, W)
    useful = int((end - begin).sum())
    print("kept keys", int((end > begin).sum()), "of", S, "; kept pairs", useful)
    for bm in (32, 64):
        work = sum(GROUP * -(-(hi - lo) // bm) * bm for lo, hi in group_spans(begin, end, bm))
        print(f"block_m {bm}: kept pairs / computed pairs = {useful / work:.3f}")
    steps = np.array([G * -(-(hi - lo) // 32) for lo, hi in group_spans(begin, end, 32)])
    print("CTAs per KV head", len(steps), "; longest CTA", steps.max(), "steps; average per CTA slot "
          f"(132 SMs x 2, all {HK} KV heads) {steps.sum() * HK / 264:.0f} steps")


if __name__ == "__main__":
    main()
