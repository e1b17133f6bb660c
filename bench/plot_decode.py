"""Plot of bench_decode.py --sweep's JSON: decode latency against cache length for Flash-DMA,
with and without a select_state, dense SDPA flash over the whole cache, and torch topk +
gather + SDPA.
Usage: python3 bench/plot_decode.py results.json out.png"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

SYSTEMS = [("state_ms", "Flash-DMA kvcache, select_state kept"), ("ours_ms", "Flash-DMA kvcache, selecting each step"),
           ("dense_flash_ms", "dense SDPA flash, whole cache"),
           ("topk_ms", "torch topk + gather + SDPA")]


def main():
    rows = json.load(open(sys.argv[1]))
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for key, label in SYSTEMS:
        pts = [(r["K"], r[key]) for r in rows if r.get(key) == r.get(key) and r.get(key)]
        ax.plot([k for k, _ in pts], [t for _, t in pts], marker="o", label=label)
    r0 = rows[0]
    ax.set_title(f"decode step, B{r0['B']} H{r0['H']} Hk{r0['Hk']} D{r0['D']} w{r0['w']}, bf16, H100")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("cached keys per sequence")
    ax.set_ylabel("ms per step (CUDA graph)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(sys.argv[2], dpi=110)


if __name__ == "__main__":
    main()
