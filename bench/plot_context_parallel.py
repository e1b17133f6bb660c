"""Plot of bench_context_parallel.py --json's rows: fwd+bwd time against sequence length on one
GPU and on P GPUs (with the compute alone), causal top-w, B1 H16 Hk4 D128 w2048, bf16.
Usage: python3 bench/plot_context_parallel.py results.json out.png [device name]"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    rows = [r for r in json.load(open(sys.argv[1])) if "tokens" in r]
    device = sys.argv[3] if len(sys.argv) > 3 else "GPU"
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    series = [("1 GPU", [r for r in rows if not r.get("distributed")], "ms")]
    for p in sorted({r["gpus"] for r in rows if r.get("distributed")}):
        mine = [r for r in rows if r.get("distributed") and r["gpus"] == p]
        series += [(f"{p} GPUs", mine, "ms"), (f"{p} GPUs, compute alone", mine, "compute_ms")]
    for label, pts, key in series:
        pts = sorted(pts, key=lambda r: r["tokens"])
        ax.plot([r["tokens"] / 2 ** 20 for r in pts], [r[key] for r in pts], marker="o", label=label,
                linestyle="--" if "alone" in label else "-")
    ax.set_title(f"causal top-w fwd+bwd, B1 H16 Hk4 D128 w2048, bf16\n{device}", fontsize=10)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("tokens (M)")
    ax.set_ylabel("ms per step")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(sys.argv[2], dpi=120)


if __name__ == "__main__":
    main()
