"""transformers' Doge model with its dynamic mask attention on Flash-DMA.

A small randomly initialised DogeForCausalLM (no download): one training step and a greedy
generation, each run by transformers' own code and after flash_dma.integrations.transformers
.enable(model), with the differences printed. On a GPU the model runs in bfloat16.

    python examples/doge_generate.py [--seqlen 2048] [--window 256]
"""
import argparse
import copy

import torch
from transformers import DogeConfig, DogeForCausalLM

import flash_dma


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seqlen", type=int, default=512)
    ap.add_argument("--window", type=int, default=64, help="keep_window_size: keys each query keeps")
    args = ap.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    torch.manual_seed(0)
    config = DogeConfig(vocab_size=args.seqlen + 64, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, keep_window_size=args.window,
                        max_position_embeddings=2 * args.seqlen + 64)
    config._attn_implementation = "eager"
    ref = DogeForCausalLM(config).to(device=device, dtype=dtype)
    with torch.no_grad():  # A starts at zero (every key scored alike): spread the scores
        for layer in ref.model.layers:
            layer.self_attn.A.normal_()
    ours = flash_dma.integrations.transformers.enable(copy.deepcopy(ref))

    # Distinct tokens: a repeated token repeats its score, and torch.topk's tie order is unset.
    ids = torch.randperm(config.vocab_size)[: args.seqlen].unsqueeze(0).to(device)
    for name, model in (("transformers", ref), ("flash_dma", ours)):
        model.zero_grad()
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        grad = model.model.layers[0].self_attn.dt_proj.weight.grad.float().norm().item()
        print(f"{name:>12}: loss {out.loss.item():.5f}, |d dt_proj| {grad:.5f}")
    with torch.no_grad():
        prompt = ids[:, : args.seqlen // 2]
        gen = {name: m.generate(prompt, max_new_tokens=16, do_sample=False) for name, m in
               (("transformers", ref), ("flash_dma", ours))}
    same = torch.equal(gen["transformers"], gen["flash_dma"])
    print(f"greedy generation of 16 tokens: {'identical' if same else 'differs'}")


if __name__ == "__main__":
    main()
