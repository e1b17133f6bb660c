"""Work of the dynamic-mask forward (128-row query tiles, 128-key tiles) and dq kernel (64 x 64)
over their per-query-tile key lists, simulated on the CPU (numpy) for the causal top-w selection
of random scores: kept pairs over computed (query, key) pairs with every tile full width, with
the last tile of a list 32 or 64 keys wide where it holds no more (FDMA_FWD_LAST_TILE=narrow in
the forward), and over the lists' exact lengths (docs/performance.md, "key lists").

With --checkpoints C, also the candidates the tile-lists kernel scans: now, every kept key
below a tile's last row; with checkpoint lists (dma_lists.cu), every C tiles the kept keys still
alive at the checkpoint's first row, so that a tile scans its checkpoint's list and the kept
keys from the checkpoint's row on, plus each checkpoint's own scan of the kept keys below it;
and the longest single scans, which set the time of a launch whose CTAs fit one wave.

Usage: python3 tools/profiling/simulate_tile_lists.py [--seqlens 16384,32768,131072] [--w 2048]
       [--checkpoints 8]  (the seed config: --seqlens 32768 --w 1024)
"""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from simulate_dkdv_groups import causal_intervals  # noqa: E402


def scanned_candidates(begin, end, block_m, every):
    """Candidates the tile lists scan for causal intervals [begin, end) (empty: not kept), one
    tile a block_m rows: (now, with checkpoint lists every `every` tiles, the checkpoints' own
    scans, the largest checkpoint list), and the longest single scans, which bound a launch
    whose CTAs all fit one wave: (a tile's now, a checkpoint's, a tile's with checkpoints)."""
    S = len(begin)
    kept = np.nonzero(end > begin)[0]  # index order, as the kept list
    now = tiles_scan = ckpt_scan = largest = 0
    longest = [0, 0, 0]
    for t in range(-(-S // block_m)):
        below = int(np.searchsorted(kept, min(S, (t + 1) * block_m)))  # kept keys before the tile's end
        now += below
        c = t // every * every * block_m  # the tile's checkpoint row
        since = int(np.searchsorted(kept, c))  # kept keys before it
        alive = int((end[kept[:since]] > c).sum())  # its list
        largest = max(largest, alive)
        tiles_scan += alive + below - since
        if t % every == 0:
            ckpt_scan += since
        longest = [max(longest[0], below), max(longest[1], since), max(longest[2], alive + below - since)]
    return (now, tiles_scan, ckpt_scan, largest), tuple(longest)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seqlens", default="16384,32768,131072")
    ap.add_argument("--w", type=int, default=2048)
    ap.add_argument("--checkpoints", type=int, default=0, help="tiles a checkpoint list (0: none)")
    args = ap.parse_args()
    for S in map(int, args.seqlens.split(",")):
        scores = np.random.default_rng(0).standard_normal(S).astype(np.float32)
        begin, end = causal_intervals(scores, args.w)
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
        if args.checkpoints:
            (now, tiles, ckpts, largest), (one, one_ckpt, one_tile) = scanned_candidates(begin, end, 128,
                                                                                   args.checkpoints)
            print(f"S {S}, tile lists' candidates scanned: now {now}; with a checkpoint list every "
                  f"{args.checkpoints} tiles {tiles} + {ckpts} for the checkpoints = {tiles + ckpts} "
                  f"({now / (tiles + ckpts):.2f}x fewer), the largest list {largest} keys; the longest "
                  f"scan {one} now, {one_ckpt} (a checkpoint) then {one_tile} (a tile) with them")


if __name__ == "__main__":
    main()
