"""Context parallelism on one host: flash_dma.distributed.dynamic_mask_attention over P GPUs
against flash_dma.dynamic_mask_attention on one, causal top-w, forward + backward, bf16.

  torchrun --nproc_per_node 2 bench/bench_context_parallel.py [--tokens 1M,2M,4M] [--single 1M,2M]

Per length: the step's wall time on one GPU (rank 0 alone), on all P (the slowest rank, CUDA
events between barriers, median of --reps), the same ranks' compute alone (the local call on
tensors gathered beforehand: what the collectives add is the difference), the collectives
alone, and each rank's peak memory. First a correctness check at --check tokens: every
rank's shard of output and gradients against the single-GPU call on the whole problem.
Prints a table; --json writes the rows (rank 0).
"""
import argparse
import json
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))
import flash_dma  # noqa: E402
import flash_dma.distributed as fd  # noqa: E402
from flash_dma.distributed import _gather_seq, _scatter_seq_sum  # noqa: E402

B, H, HK, D, W = 1, 16, 4, 128, 2048


def tokens(text):
    scale = {"K": 2 ** 10, "M": 2 ** 20}
    return [int(float(t[:-1]) * scale[t[-1]]) if t[-1] in scale else int(t) for t in text.split(",") if t]


def label(n):
    return f"{n / 2 ** 20:g}M" if n >= 2 ** 20 else f"{n / 2 ** 10:g}K"


def shard_tensors(N, rank, world, seed, device):
    """This rank's contiguous shard, from its own seed (timing only; correctness is checked at
    --check tokens)."""
    n = N // world + (1 if rank < N % world else 0)
    g = torch.Generator(device=device).manual_seed(seed + rank)
    mk = lambda *s: torch.randn(*s, device=device, dtype=torch.bfloat16, generator=g)  # noqa: E731
    q, k, v, dout = mk(B, n, H, D), mk(B, n, HK, D), mk(B, n, HK, D), mk(B, n, H, D)
    s = torch.rand(B, HK, n, device=device, generator=g)
    return q, k, v, s, dout


def timed(fn, reps, world):
    """Median over reps of the slowest rank's ms (events between barriers)."""
    fn()
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        if world > 1:
            dist.barrier()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        t = torch.tensor([a.elapsed_time(b)], device="cuda")
        if world > 1:
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
        times.append(t.item())
    times.sort()
    return times[len(times) // 2]


def step(q, k, v, s, dout, distributed):
    q, k, v, s = (t.detach().requires_grad_(True) for t in (q, k, v, s))
    f = fd.dynamic_mask_attention if distributed else flash_dma.dynamic_mask_attention
    out = f(q, k, v, s, W)
    out.backward(dout)


def check(N, rank, world, device):
    """Each rank's shard of the P-GPU result against the one-GPU call on the whole problem."""
    g = torch.Generator(device=device).manual_seed(99)
    q, k, v, dout = (torch.randn(B, N, h, D, device=device, dtype=torch.bfloat16, generator=g) for h in (H, HK, HK, H))
    s = torch.rand(B, HK, N, device=device, generator=g)
    full = [t.clone().requires_grad_(True) for t in (q, k, v, s)]
    ref = flash_dma.dynamic_mask_attention(*full, W)
    ref.backward(dout)
    per = [N // world + (1 if r < N % world else 0) for r in range(world)]
    a, b = sum(per[:rank]), sum(per[: rank + 1])
    mine = [t.detach().clone().requires_grad_(True) for t in (q[:, a:b], k[:, a:b], v[:, a:b], s[:, :, a:b])]
    out = fd.dynamic_mask_attention(*mine, W)
    out.backward(dout[:, a:b])
    diffs = {"out": (out.float() - ref[:, a:b].float()).abs().max().item()}
    for name, got, want in zip(("dq", "dk", "dv", "dkey_scores"), mine,
                               (full[0].grad[:, a:b], full[1].grad[:, a:b], full[2].grad[:, a:b],
                                full[3].grad[:, :, a:b])):
        diffs[name] = (got.grad.float() - want.float()).abs().max().item()
    t = torch.tensor(list(diffs.values()), device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return dict(zip(diffs, t.tolist()))


def table(rows, world):
    single = {r["tokens"]: r["ms"] for r in rows if r.get("gpus") == 1 and not r.get("distributed")}
    out = [f"| tokens | 1 GPU ms | {world} GPUs ms | speedup | compute alone ms | collectives alone ms | "
           f"added by the collectives | peak GiB a rank |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if not r.get("distributed"):
            continue
        one = single.get(r["tokens"])
        out.append(f"| {label(r['tokens'])} | " + (f"{one:.1f} | " if one else "- | ") + f"{r['ms']:.1f} | " +
                   (f"{one / r['ms']:.2f}x | " if one else "- | ") +
                   f"{r['compute_ms']:.1f} | {r['comm_ms']:.1f} | {100 * (r['ms'] / r['compute_ms'] - 1):.1f}% | "
                   f"{r['peak_gib']:.1f} |")
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", default="1M,2M,4M")
    ap.add_argument("--single", default="1M,2M")
    ap.add_argument("--check", type=int, default=65536)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json")
    args = ap.parse_args()
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    device = torch.device("cuda")
    rows = []
    if args.check:
        diffs = check(args.check, rank, world, device)
        if rank == 0:
            print(f"check at {args.check} tokens on {world} GPUs against one, max abs diff: " +
                  ", ".join(f"{k} {v:.3g}" for k, v in diffs.items()), flush=True)
        rows.append(dict(check_tokens=args.check, **diffs))
    for N in tokens(args.single):
        if rank == 0:
            torch.cuda.reset_peak_memory_stats()
            q, k, v, s, dout = shard_tensors(N, 0, 1, 1, device)
            ms = timed(lambda: step(q, k, v, s, dout, False), args.reps, 1)
            peak = torch.cuda.max_memory_allocated() / 2 ** 30
            del q, k, v, s, dout
            torch.cuda.empty_cache()
            rows.append(dict(gpus=1, tokens=N, ms=ms, peak_gib=peak))
            print(f"1 GPU, {label(N)} tokens: {ms:.1f} ms fwd+bwd, peak {peak:.1f} GiB", flush=True)
        dist.barrier()
    for N in tokens(args.tokens):
        torch.cuda.reset_peak_memory_stats()
        q, k, v, s, dout = shard_tensors(N, rank, world, 1, device)
        ms = timed(lambda: step(q, k, v, s, dout, True), args.reps, world)
        peak = torch.tensor([torch.cuda.max_memory_allocated() / 2 ** 30], device=device)
        dist.all_reduce(peak, op=dist.ReduceOp.MAX)
        # The same ranks' compute alone: the local call on keys gathered beforehand.
        lengths = [N // world + (1 if r < N % world else 0) for r in range(world)]
        end = sum(lengths[: rank + 1])
        kk, vv = _gather_seq(k, 1, lengths, None)[:, :end], _gather_seq(v, 1, lengths, None)[:, :end]
        ss = _gather_seq(s, 2, lengths, None)[:, :, :end]

        def local():
            qq, k2, v2, s2 = (t.detach().requires_grad_(True) for t in (q, kk, vv, ss))
            flash_dma.dynamic_mask_attention(qq, k2, v2, s2, W).backward(dout)
        compute_ms = timed(local, args.reps, world)
        del kk, vv, ss
        # The collectives alone: K, V and scores gathered, dK, dV, dscores reduce-scattered.
        full_k = torch.zeros(B, end, HK, D, device=device, dtype=torch.bfloat16)
        full_s = torch.zeros(B, HK, end, device=device)
        pad = sum(lengths) - end

        def comm():
            _gather_seq(k, 1, lengths, None), _gather_seq(v, 1, lengths, None), _gather_seq(s, 2, lengths, None)
            for g, d in ((full_k, 1), (full_k, 1), (full_s, 2)):
                shape = list(g.shape)
                shape[d] = pad
                _scatter_seq_sum(torch.cat([g, g.new_zeros(shape)], d), d, lengths, rank, None)
        comm_ms = timed(comm, args.reps, world)
        del full_k, full_s, q, k, v, s, dout
        torch.cuda.empty_cache()
        row = dict(gpus=world, distributed=True, tokens=N, ms=ms, compute_ms=compute_ms, comm_ms=comm_ms,
                   peak_gib=peak.item())
        rows.append(row)
        if rank == 0:
            print(f"{world} GPUs, {label(N)} tokens: {ms:.1f} ms fwd+bwd (compute alone {compute_ms:.1f}, "
                  f"collectives alone {comm_ms:.1f}), peak {peak.item():.1f} GiB a rank", flush=True)
    if rank == 0:
        print()
        print(table(rows, world))
        if args.json:
            with open(args.json, "w") as f:
                json.dump(rows, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
