"""A small Llama (random weights, built from a config: no download) run forward and backward
with Flash-DMA as its attention implementation, checked against transformers' own sdpa, with
left padding in the batch.

    python3 examples/hf_tiny_llama.py [--device cuda]
"""
import argparse

import torch
from transformers import LlamaConfig, LlamaForCausalLM

import flash_dma  # noqa: F401  (registers "flash_dma" and "fdma" with transformers)


def run(impl, config, ids, mask, device, dtype):
    torch.manual_seed(0)
    config._attn_implementation = impl
    model = LlamaForCausalLM(config).to(device, dtype)
    out = model(input_ids=ids, attention_mask=mask, labels=ids)
    out.loss.backward()
    return out.loss.item(), model.model.layers[0].self_attn.q_proj.weight.grad.float().norm().item()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    config = LlamaConfig(vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
    torch.manual_seed(0)
    ids = torch.randint(0, 256, (2, 96), device=args.device)
    mask = torch.ones_like(ids)
    mask[1, :10] = 0  # left padding in the second sequence
    ours = run("fdma", config, ids, mask, args.device, dtype)
    ref = run("sdpa", config, ids, mask, args.device, dtype)
    print(f"flash_dma loss {ours[0]:.5f} |grad q_proj| {ours[1]:.5f}")
    print(f"sdpa      loss {ref[0]:.5f} |grad q_proj| {ref[1]:.5f}")
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-4
    assert abs(ours[0] - ref[0]) <= tol * abs(ref[0]) and abs(ours[1] - ref[1]) <= 5 * tol * abs(ref[1])
    print("flash_dma matches sdpa")


if __name__ == "__main__":
    main()
