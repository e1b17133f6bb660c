"""Work of the dynamic-mask forward (128-row query tiles, 128-key tiles) and dq kernel (64 x 64)
over their per-query-tile key lists, simulated on the CPU (numpy) for the causal top-w selection
of random scores: kept pairs over computed (query, key) pairs with every tile full width, with
the last tile of a list 32 or 64 keys wide where it holds no more (FDMA_FWD_LAST_TILE=narrow in
the forward), and over the lists' exact lengths (docs/performance.md, "key lists").

Usage: python3 tools/profiling/simulate_tile_lists.py [--seqlens 16384,32768,131072]
"""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from simulate_dkdv_groups import W, causal_intervals  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seqlens", default="16384,32768,131072")
    args = ap.parse_args()
    for S in map(int, args.seqlens.split(",")):
        scores = np.random.default_rng(0).standard_normal(S).astype(np.float32)
        begin, end = causal_intervals(scores, W)
        kept = end > begin
        b, e = begin[kept], end[kept]
        useful = int((e - b).sum())
        for block_m, block_n, name in ((128, 128, "forward 128 x 128"), (64, 64, "dq 64 x 64")):
            tiles = -(-S // block_m)
            # a key is listed for the query tiles its interval meets
            delta = np.zeros(tiles + 1, np.int64)
            np.add.at(delta, b // block_m, 1)
            np.add.at(delta, (e - 1) // block_m + 1, -1)
            listed = np.cumsum(delta)[:tiles]
            rows = np.minimum(block_m, S - np.arange(tiles) * block_m)
            full = -(-listed // block_n) * block_n
            last = listed - (np.maximum(listed, 1) - 1) // block_n * block_n  # keys in the last tile
            narrow_last = np.where(last <= 32, 32, np.where(last <= 64, 64, block_n))
            narrow = np.where(listed > block_n, listed - last + narrow_last, full)
            cells = [f"{useful / (rows * keys).sum():.3f}" for keys in (full, narrow, listed)]
            print(f"S {S}, {name}: kept / computed pairs: full tiles {cells[0]}, narrow last tile {cells[1]}, "
                  f"exact lists {cells[2]}")


if __name__ == "__main__":
    main()
