"""Plot of bench_dma_causal.py's JSON: forward and forward+backward time against sequence
length for each system. Usage: python3 bench/plot_dma_causal.py results.json out.png"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

SYSTEMS = [("flash-dma", "Flash-DMA (top-w)"), ("floor", "floor: flash over w keys"),
           ("cudnn", "dense SDPA cuDNN causal"), ("flex", "FlexAttention (kernel only)"),
           ("sdpa+bias", "SDPA efficient + dense bias"), ("attention+mask", "Flash-DMA attention + 4-D mask")]


def main():
    data = json.load(open(sys.argv[1]))
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, pas in zip(axes, ("fwd", "fwd+bwd")):
        for key, label in SYSTEMS:
            pts = [(r["S"], r["times_ms"].get(f"{key} {pas}")) for r in data["results"]]
            pts = [(s, t) for s, t in pts if t]
            if pts:
                ax.plot([s for s, _ in pts], [t for _, t in pts], marker="o", label=label)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length")
        ax.set_ylabel("ms")
        ax.set_title(pas)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"{data['device']}: causal top-w attention, bf16, B{data['B']} H{data['H']} Hk{data['Hk']} "
                 f"D{data['D']} w{data['w']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(sys.argv[2], dpi=110)


if __name__ == "__main__":
    main()
