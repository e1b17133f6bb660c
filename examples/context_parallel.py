"""Context parallelism: one long sequence sharded across processes, each holding a contiguous
piece of it, through flash_dma.nn.DynamicMaskAttention with a process group.

  torchrun --nproc_per_node 2 examples/context_parallel.py              # GPUs, NCCL
  torchrun --nproc_per_node 3 examples/context_parallel.py --cpu        # CPU backend, gloo

Every rank builds the same layer and the whole sequence (so that rank 0 can check the
result against one process), keeps its shard, runs forward and backward, and all-reduces the
layer's parameter gradients as data parallelism would. Rank 0 prints the largest difference
from the single-process run.
"""
import argparse
import os

import torch
import torch.distributed as dist

import flash_dma


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cpu", action="store_true")
    ap.add_argument("--tokens", type=int, default=16384)
    args = ap.parse_args()
    dist.init_process_group("gloo" if args.cpu else "nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.cpu:
        device, dtype, N = torch.device("cpu"), torch.float32, min(args.tokens, 2048)
    else:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
        device, dtype, N = torch.device("cuda"), torch.bfloat16, args.tokens
    H, Hk, D, w = 8, 2, 64, 256

    torch.manual_seed(0)  # the same layer and the same sequence on every rank
    layer = flash_dma.nn.DynamicMaskAttention(H, Hk, D, window_size=w, device=device, dtype=dtype,
                                              process_group=dist.group.WORLD)
    q = torch.randn(1, N, H, D, device=device, dtype=dtype)
    k = torch.randn(1, N, Hk, D, device=device, dtype=dtype)
    v = torch.randn(1, N, Hk, D, device=device, dtype=dtype)

    # This rank's contiguous shard (the last ranks get one token fewer when N % world != 0).
    sizes = [N // world + (1 if r < N % world else 0) for r in range(world)]
    a, b = sum(sizes[:rank]), sum(sizes[: rank + 1])
    out = layer(q[:, a:b], k[:, a:b], v[:, a:b])
    out.float().square().sum().backward()
    for p in layer.parameters():  # per-rank shares of the parameter gradients
        dist.all_reduce(p.grad)

    # One process over the whole sequence, for comparison.
    layer.process_group = None
    grads = [p.grad.clone() for p in layer.parameters()]
    layer.zero_grad()
    ref = layer(q, k, v)
    ref.float().square().sum().backward()
    with torch.no_grad():
        diff_out = (out.float() - ref[:, a:b].float()).abs().max()
        diff_grad = max((g.float() - p.grad.float()).abs().max() / p.grad.float().abs().max().clamp_min(1e-12)
                        for g, p in zip(grads, layer.parameters()))
        t = torch.stack([diff_out, diff_grad.float()]).to(device)
    # The autograd graph of `out` holds the process group (its backward needs it): free it, so
    # that destroying the group joins its threads now. Left alive, a gloo thread can still be
    # releasing tensors while the interpreter exits, and the process aborts.
    del out, ref
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    if rank == 0:
        print(f"{world} ranks, {N} tokens: output max abs diff {t[0].item():.3g}, "
              f"parameter gradients max relative diff {t[1].item():.3g} against one process")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
