"""A Doge model's training step (forward + backward) through transformers' own attention
path against the same model after flash_dma.integrations.transformers.enable, in one run.

One randomly initialised DogeForCausalLM decoder layer (hidden 1024, 8 query heads and 2 KV
heads of 128, keep_window_size 2048, bfloat16) over one sequence of S tokens: the step's time
(CUDA events, median of 5 after 2 warm-ups) and its peak memory. transformers builds the
[B, Hk, S, S] dynamic mask (scores expanded, torch.topk, a dense float mask) and hands it to
SDPA; flash_dma selects and attends in O(S) memory. A step that does not fit is reported as
out of memory.

    python bench/bench_doge.py [--seqlens 8192 16384 32768] [--json out.json]
"""
import argparse
import copy
import json

import torch
from transformers import DogeConfig, DogeForCausalLM

import flash_dma
from bench_attention import median_ms


def build(S, window):
    torch.manual_seed(0)
    config = DogeConfig(vocab_size=1024, hidden_size=1024, intermediate_size=2048, num_hidden_layers=1,
                        num_attention_heads=8, num_key_value_heads=2, keep_window_size=window,
                        max_position_embeddings=S + 64, attention_dropout=0.0, hidden_dropout=0.0)
    config._attn_implementation = "sdpa"
    model = DogeForCausalLM(config)
    with torch.no_grad():  # A starts at zero (every key scored alike): spread the scores
        for layer in model.model.layers:
            layer.self_attn.A.normal_()
    return model.to(device="cuda", dtype=torch.bfloat16)


def time_step(model, ids):
    def step():
        model.zero_grad(set_to_none=True)
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()

    try:
        torch.cuda.reset_peak_memory_stats()
        return median_ms(step, warmup=2, iters=5), torch.cuda.max_memory_allocated() / 2 ** 30
    except torch.OutOfMemoryError:
        model.zero_grad(set_to_none=True)
        torch.cuda.empty_cache()
        return float("nan"), float("nan")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seqlens", type=int, nargs="+", default=[8192, 16384, 32768])
    ap.add_argument("--window", type=int, default=2048)
    ap.add_argument("--json")
    args = ap.parse_args()
    rows = []
    for S in args.seqlens:
        ref = build(S, args.window)
        ids = torch.randint(0, 1024, (1, S), device="cuda")
        hf_ms, hf_gib = time_step(ref, ids)
        ours = flash_dma.integrations.transformers.enable(copy.deepcopy(ref))
        del ref
        torch.cuda.empty_cache()
        fd_ms, fd_gib = time_step(ours, ids)
        del ours
        torch.cuda.empty_cache()
        rows.append(dict(S=S, window=args.window, transformers_ms=hf_ms, transformers_GiB=hf_gib, flash_dma_ms=fd_ms,
                         flash_dma_GiB=fd_gib))
    print(f"{'S':>7} {'transformers ms':>16} {'GiB':>6} {'flash_dma ms':>13} {'GiB':>6} {'speedup':>8}")
    for r in rows:
        print(f"{r['S']:>7} {r['transformers_ms']:16.2f} {r['transformers_GiB']:6.1f} {r['flash_dma_ms']:13.2f} "
              f"{r['flash_dma_GiB']:6.1f} {r['transformers_ms'] / r['flash_dma_ms']:7.1f}x")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1)


if __name__ == "__main__":
    main()
