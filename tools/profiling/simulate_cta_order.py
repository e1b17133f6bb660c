"""The order in which the dynamic-mask forward and dq CTAs start, simulated on the CPU (numpy):
per-query-tile list lengths from the causal top-w selection of random scores (one seed per KV
head; B1 H16 Hk4 w2048), each CTA taking its list's tiles plus a fixed 0.7 tile of prologue
and epilogue, handed to the first free slot of 132 SMs (the forward: one CTA per SM; dq: two)
in launch order. Prints the makespan over the perfectly balanced time for the grid order
(heads one after the other, query tiles ascending), the same with query tiles descending, and
the largest-first order FDMA_LONGEST_FIRST=1 launches (query tiles descending, every head's
together; cta_order.cuh). docs/performance.md, "key lists".

With --packed L1,L2,...: dense causal attention over a packed batch of those sequence lengths
(attention_varlen on CUDA), each query tile walking its tile range (its first sequence's keys up
to its last row's causal limit), against one dense call per sequence.

Usage: python3 tools/profiling/simulate_cta_order.py [--seqlens 16384,32768,131072]
       python3 tools/profiling/simulate_cta_order.py --packed 32435,24676,20713,16307,12365,10240,7192,7144
"""
import argparse
import heapq
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from simulate_dkdv_groups import causal_intervals  # noqa: E402

H, HK, W, SMS, PROLOGUE = 16, 4, 2048, 132, 0.7


def tiles_per_query_tile(S, block_m, block_n, seed):
    scores = np.random.default_rng(seed).standard_normal(S).astype(np.float32)
    begin, end = causal_intervals(scores, W)
    kept = end > begin
    b, e = begin[kept], end[kept]
    tiles = -(-S // block_m)
    delta = np.zeros(tiles + 1, np.int64)
    np.add.at(delta, b // block_m, 1)
    np.add.at(delta, (e - 1) // block_m + 1, -1)
    return -(-np.cumsum(delta)[:tiles] // block_n)


def makespan(durations, slots):
    free = [0.0] * slots
    for d in durations:
        heapq.heappush(free, heapq.heappop(free) + d)
    return max(free)


def packed_tile_keys(lens, block_m):
    """Keys in each query tile's range of a causal packed batch (dma_lists.cu, tile ranges)."""
    cu = np.concatenate([[0], np.cumsum(lens)])
    total = int(cu[-1])
    lo = np.arange(0, total, block_m)
    hi = np.minimum(lo + block_m, total)
    s_lo = np.searchsorted(cu, lo, side="right") - 1
    s_hi = np.searchsorted(cu, hi - 1, side="right") - 1
    last_row_keys = np.minimum(np.asarray(lens)[s_hi], hi - cu[s_hi])  # the last row's causal limit
    return cu[s_hi] - cu[s_lo] + last_row_keys


def packed(lens, block=128):
    """Makespan over balanced for the packed batch's grid order and largest-first, and for one
    dense call per sequence (each in largest-first order, run one after another), one CTA an SM."""
    keys = packed_tile_keys(lens, block)
    tiles = [-(-k // block) + PROLOGUE for k in keys]
    grid = [t for _ in range(H) for t in tiles]
    ideal = sum(grid) / SMS
    per_seq = 0.0
    for n in lens:
        own = [-(-min(n, (x + 1) * block) // block) + PROLOGUE for x in range(-(-n // block))]
        per_seq += makespan(sorted([t for _ in range(H) for t in own], reverse=True), SMS)
    print(f"packed {len(lens)} sequences, {sum(lens)} tokens: makespan / balanced: grid order "
          f"{makespan(grid, SMS) / ideal:.3f}, largest first {makespan(sorted(grid, reverse=True), SMS) / ideal:.3f}; "
          f"one call per sequence {per_seq / ideal:.3f}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seqlens", default="16384,32768,131072")
    ap.add_argument("--packed", help="sequence lengths of a dense causal packed batch, comma-separated")
    args = ap.parse_args()
    if args.packed:
        return packed([int(x) for x in args.packed.split(",")])
    for S in map(int, args.seqlens.split(",")):
        for name, block, slots in (("forward", 128, SMS), ("dq", 64, 2 * SMS)):
            per_kv = [tiles_per_query_tile(S, block, block, seed) for seed in range(HK)]
            n = len(per_kv[0])
            dur = {(x, h): per_kv[h // (H // HK)][x] + PROLOGUE for x in range(n) for h in range(H)}
            ideal = sum(dur.values()) / slots
            orders = {
                "grid order": [(x, h) for h in range(H) for x in range(n)],
                "tiles descending": [(x, h) for h in range(H) for x in reversed(range(n))],
                "largest first": [(x, h) for x in reversed(range(n)) for h in range(H)],
            }
            cells = [f"{k} {makespan([dur[c] for c in o], slots) / ideal:.3f}" for k, o in orders.items()]
            print(f"S {S}, {name}: makespan / balanced: " + ", ".join(cells))


if __name__ == "__main__":
    main()
