"""The order in which the dynamic-mask forward and dq CTAs start, simulated on the CPU (numpy):
per-query-tile list lengths from the causal top-w selection of random scores (one seed per KV
head; B1 H16 Hk4 w2048), each CTA taking its list's tiles plus a fixed 0.7 tile of prologue
and epilogue, handed to the first free slot of 132 SMs (the forward: one CTA per SM; dq: two)
in launch order. Prints the makespan over the perfectly balanced time for the grid order
(heads one after the other, query tiles ascending), the same with query tiles descending, and
the largest-first order FDMA_LONGEST_FIRST=1 launches (query tiles descending, every head's
together; cta_order.cuh). docs/performance.md, "key lists".

Usage: python3 tools/profiling/simulate_cta_order.py [--seqlens 16384,32768,131072]
"""
import argparse
import heapq
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from simulate_dkdv_groups import W, causal_intervals  # noqa: E402

H, HK, SMS, PROLOGUE = 16, 4, 132, 0.7


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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seqlens", default="16384,32768,131072")
    args = ap.parse_args()
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
