"""Load balance of the dynamic-mask dk/dv kernel, simulated on the CPU (numpy): the causal
top-w selection of random scores (key j is kept by queries [j, end_j) while fewer than w
visible keys outrank it, ties to the lower index), then the kernel's grouping: windows of 256
kept keys ranked by interval end, groups of 64 keys, each walking the 32-query tiles its
keys span for each of the G query heads. Prints the share of computed pairs that are kept
pairs, and the longest CTA against the average per CTA slot (docs/perf-notes.md).

Usage: python3 bench/simulate_dkdv_groups.py
"""
import numpy as np
S, w = 16384, 2048  # B1 Hk4 G4, as in bench_dma_causal.py
rng = np.random.default_rng(0)
s = rng.standard_normal(S).astype(np.float32)
begin = np.zeros(S, np.int64); end = np.zeros(S, np.int64)
for c0 in range(0, S, 512):
    sj = s[c0:c0+512, None]
    idx = np.arange(c0, min(c0+512, S))
    higher = (s[None, :] > sj) | ((s[None, :] == sj) & (np.arange(S)[None, :] < idx[:, None]))
    cs = np.cumsum(higher, axis=1)
    # kept by i >= j while cs[i] < w
    reach = cs >= w
    first = np.where(reach.any(1), reach.argmax(1), S)
    begin[c0:c0+512] = idx
    end[c0:c0+512] = np.maximum(first, idx)
kept = np.nonzero(end > begin)[0]
useful = (end - begin).sum()
print("kept keys", len(kept), "useful pairs", useful, "= Sq*w approx", S * w)
for bm in (32, 64):
    work = 0; work_q = 0
    for w0 in range(0, len(kept), 256):
        win = kept[w0:w0+256]
        order = sorted(range(len(win)), key=lambda i: (-end[win[i]], i))
        for g0 in range(0, len(win), 64):
            grp = win[[order[i] for i in range(g0, min(g0+64, len(win)))]]
            lo = begin[grp].min() // bm * bm; hi = end[grp].max()
            work += 64 * (-(-(hi - lo) // bm) * bm)
    print("block_m", bm, "work", work, "efficiency", useful / work)
bm = 32; G = 4; Hk = 4
steps = []
for w0 in range(0, len(kept), 256):
    win = kept[w0:w0+256]
    order = sorted(range(len(win)), key=lambda i: (-end[win[i]], i))
    for g0 in range(0, len(win), 64):
        grp = win[[order[i] for i in range(g0, min(g0+64, len(win)))]]
        lo = begin[grp].min() // bm * bm; hi = end[grp].max()
        steps.append(G * -(-(hi - lo) // bm))
steps = np.array(steps)
print("CTAs per hk", len(steps), "max steps", steps.max(), "total steps (all hk)", steps.sum() * Hk, "per slot (132 SMs x 2)", steps.sum() * Hk / 264)
print(np.sort(steps)[::-1][:20])
