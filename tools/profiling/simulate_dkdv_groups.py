"""Load balance of the dynamic-mask dk/dv kernel, simulated on the CPU (numpy): the causal
top-w selection of random scores (key j is kept by queries [j, end_j) while fewer than w
visible keys outrank it, ties to the lower index), then the kernel's grouping: windows of
kept keys (ordered by interval end, ranked by index; or, as before, in index order
ranked by end), groups of 64 keys, each walking the 64-query steps its
keys span for each of the G query heads. Prints, per window size, the share of computed pairs
that are kept pairs, and the longest CTA against the average per SM (docs/performance.md, "key lists").

With --keys 128 --windows 512 (the warp-specialized backward's groups, attention_bwd_ws.cuh)
it also schedules that kernel's items: each group's walk cut at query ranges of --range-tiles
64-row tiles (default: bwd_ws_tiles_per_range's eighth of the average SM's work), handed out
lowest range first to the first free of 132 SMs, each item costing its steps plus --prologue
steps; the makespan against the average SM's work, and the same for whole walks in grid order;
and what a consumer half (64 of the group's keys by index) would compute if it skipped the
steps none of its keys is kept in.

With --end-quantum Q the kept keys are ordered by end // Q (then index) instead of by end: what a
sort over fewer bits (Q = 64: the walk's tiles) would give.

Usage: python3 tools/profiling/simulate_dkdv_groups.py [--seqlen 131072] [--windows 256,1024]
       [--w 2048 --kv-heads 4 --group 4]  (the seed config: --seqlen 32768 --w 1024 --kv-heads 1 --group 2)
       [--keys 128 --windows 512 --range-tiles N --prologue 2]
"""
import argparse
import heapq

import numpy as np

GROUP, STEP = 64, 64  # kBwdBlockN, the dk/dv kernel's query step (kDkdvBlockM)
END_QUANTUM = 1  # --end-quantum


def causal_intervals(scores, w):
    """Key j is kept by queries [j, end_j): end_j is the w-th smallest index among the keys that
    outrank j (ties: lower index), or n if fewer than w do. Keys are visited in rank order with
    a Fenwick tree over the indices seen so far, O(n log n)."""
    n = len(scores)
    size = 1 << max(1, (n - 1).bit_length())
    tree = np.zeros(size + 1, np.int64)
    end = np.full(n, n, np.int64)
    for seen, j in enumerate(np.lexsort((np.arange(n), -scores))):
        j = int(j)
        if seen >= w:  # descend to the w-th smallest index seen
            pos, rest, step = 0, w, size
            while step:
                if tree[pos + step] < rest:
                    pos += step
                    rest -= tree[pos]
                step //= 2
            end[j] = max(j, pos)
        i = j + 1
        while i <= size:
            tree[i] += 1
            i += i & -i
    return np.arange(n), end


def group_spans(begin, end, window, block_m, by_end):
    """(lo, hi) query range walked by each CTA's group of keys, in block_m tiles. by_end: the
    kept keys ordered by end (latest first, then index), windows ranked by index (the kernel);
    else windows of kept keys in index order ranked by end (the kernel before)."""
    kept = np.nonzero(end > begin)[0]
    if by_end:
        kept = kept[np.lexsort((kept, -(end[kept] // END_QUANTUM)))]
    for w0 in range(0, len(kept), window):
        win = kept[w0:w0 + window]
        order = np.argsort(win, kind="stable") if by_end else np.lexsort((np.arange(len(win)), -end[win]))
        for g0 in range(0, len(win), GROUP):
            grp = win[order[g0:g0 + GROUP]]
            yield begin[grp].min() // block_m * block_m, end[grp].max()


def half_spans(begin, end, window, block_m):
    """The warp-specialized groups' two consumer halves (64 keys each, by index within the
    group): for each group, its span and the spans of its halves, in block_m tiles."""
    kept = np.nonzero(end > begin)[0]
    kept = kept[np.lexsort((kept, -(end[kept] // END_QUANTUM)))]
    tiles = lambda g: (begin[g].min() // block_m, -(-end[g].max() // block_m))
    for w0 in range(0, len(kept), window):
        win = np.sort(kept[w0:w0 + window], kind="stable")
        for g0 in range(0, len(win), GROUP):
            grp = win[g0:g0 + GROUP]
            yield tiles(grp), [tiles(h) for h in (grp[:GROUP // 2], grp[GROUP // 2:]) if len(h)]


def makespan(items, sms=132, prologue=0.0):
    """Greedy list scheduling of item costs (in order) onto `sms` SMs: the last SM's end."""
    ends = [0.0] * sms
    for cost in items:
        heapq.heappush(ends, heapq.heappop(ends) + cost + prologue)
    return max(ends)


def main():
    global GROUP, END_QUANTUM
    ap = argparse.ArgumentParser()
    ap.add_argument("--seqlen", type=int, default=16384)
    ap.add_argument("--windows", default="256,1024")
    # Defaults as in bench_dma_causal.py: B1, Hk 4 KV heads of G 4 query heads each, w 2048.
    ap.add_argument("--w", type=int, default=2048)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--keys", type=int, default=64, help="keys a group (the dk/dv kernel 64, the warp-specialized 128)")
    ap.add_argument("--range-tiles", type=int, default=0, help="query tiles an item (0: the library's choice)")
    ap.add_argument("--prologue", type=float, default=2.0, help="steps an item costs besides its own")
    ap.add_argument("--end-quantum", type=int, default=1, help="order kept keys by end // this (1: exact)")
    args = ap.parse_args()
    GROUP, END_QUANTUM = args.keys, args.end_quantum
    W, HK, G = args.w, args.kv_heads, args.group
    scores = np.random.default_rng(0).standard_normal(args.seqlen).astype(np.float32)
    begin, end = causal_intervals(scores, W)
    useful = int((end - begin).sum())
    print("S", args.seqlen, "; kept keys", int((end > begin).sum()), "; kept pairs", useful)
    if GROUP == 128:
        for window in map(int, args.windows.split(",")):
            spans = list(group_spans(begin, end, window, STEP, True))
            steps = [G * -(-(hi - lo) // STEP) for lo, hi in spans]
            avg = sum(steps) * HK / 132
            # bwd_ws_tiles_per_range: an eighth of the average SM's work, G steps a tile.
            tiles = args.range_tiles or max(-(-32 // G), int(avg / 8) // G)
            items = []  # (range, steps), every KV head's alike
            for lo, hi in spans:
                t0, t1 = lo // STEP, -(-hi // STEP)
                for r in range(t0 // tiles, (t1 - 1) // tiles + 1):
                    n = min(t1, (r + 1) * tiles) - max(t0, r * tiles)
                    items += [(r, G * n)] * HK
            ranged = makespan([c for _, c in sorted(items, key=lambda x: x[0])], prologue=args.prologue)
            whole = makespan([c for c in steps for _ in range(HK)], prologue=args.prologue)
            print(f"{GROUP} keys, window {window}: kept / computed {useful / sum(GROUP * s // G * STEP for s in steps):.3f}; "
                  f"average SM {avg:.0f} steps; items of {tiles} tiles, lowest range first: makespan "
                  f"{ranged / avg:.2f}x the average ({len(items)} items); whole walks in grid order {whole / avg:.2f}x")
            # If a consumer half skipped the steps where none of its 64 keys is kept.
            halves, idle, total = 0, 0, 0
            for (lo, hi), hs in half_spans(begin, end, window, STEP):
                busy = np.zeros(hi - lo, int)
                for a, b in hs:
                    halves += GROUP // 2 * (b - a) * STEP
                    busy[a - lo:b - lo] += 1
                idle += int((busy < len(hs)).sum())
                total += hi - lo
            print(f"  halves skipping their idle steps: kept / computed {useful / halves:.3f}; "
                  f"steps with a half idle {idle / total:.1%}")
        return
    for by_end, windows in ((False, args.windows), (True, "256")):
        for window in map(int, windows.split(",")):
            spans = list(group_spans(begin, end, window, STEP, by_end))
            work = sum(GROUP * -(-(hi - lo) // STEP) * STEP for lo, hi in spans)
            steps = np.array([G * -(-(hi - lo) // STEP) for lo, hi in spans])
            print(f"{'by end, ' if by_end else 'index order, '}window {window}: kept pairs / computed pairs = "
                  f"{useful / work:.3f}; CTAs per KV head {len(steps)}; longest CTA {steps.max()} steps; "
                  f"average per SM (132 SMs, {HK} KV heads) {steps.sum() * HK / 132:.0f}")


if __name__ == "__main__":
    main()
