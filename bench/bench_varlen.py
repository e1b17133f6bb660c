"""Packed variable-length batches on the GPU: dynamic_mask_attention_varlen forward and
forward+backward against, in the same run, one sequence of about the same kept (query, key)
pairs and the same batch padded to its longest sequence (a key_padding_mask hides the padding);
then dense causal attention_varlen against one call per sequence of flash_dma.attention and of
SDPA flash (FlashAttention-2), and SDPA flash over the batch padded to its longest sequence
(exact for causal right padding: no real query sees a padding key).

  python3 bench/bench_varlen.py [--json out.json] [--dense-json dense.json]

bf16, H16 Hk4 D128 (w2048 for the dynamic mask), causal. Configurations: 8 sequences of 1K to
32K tokens, 128K in all; 1000 sequences of 128 tokens (the dynamic mask against one 128K
sequence per kept pair; dense against one batched call, all lengths being equal). Medians of
CUDA events through the public Python API (autograd included). The tables print last.
"""
import argparse
import json
import os
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))
import flash_dma  # noqa: E402
from bench_attention import median_ms  # noqa: E402

H, HK, D, W = 16, 4, 128, 2048


def kept_pairs(lens, w=W):
    """Causal top-w: query i of a sequence keeps min(w, i + 1) keys."""
    return sum(sum(min(w, i + 1) for i in range(n)) for n in lens)


def tensors(total, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(total, H, D, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_()
    k = torch.randn(total, HK, D, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_()
    v = torch.randn(total, HK, D, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_()
    s = torch.randn(HK, total, device="cuda", generator=g).requires_grad_()
    return q, k, v, s


def timed(fn, leaves, dout):
    def fwd():
        with torch.no_grad():
            fn()

    def step():
        out = fn()
        torch.autograd.grad(out, leaves, dout)

    return median_ms(fwd, warmup=2, iters=10), median_ms(step, warmup=2, iters=10)


def run_varlen(lens):
    total = sum(lens)
    q, k, v, s = tensors(total, 1)
    cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
    dout = torch.randn_like(q)
    m = max(lens)
    fn = lambda: flash_dma.dynamic_mask_attention_varlen(q, k, v, s, cu, cu, m, m, W)  # noqa: E731
    return timed(fn, (q, k, v, s), dout)


def run_one(S):
    q, k, v, s = tensors(S, 2)
    q4, k4, v4 = (t.detach().unsqueeze(0).requires_grad_() for t in (q, k, v))
    s3 = s.detach().unsqueeze(0).requires_grad_()
    dout = torch.randn_like(q4)
    fn = lambda: flash_dma.dynamic_mask_attention(q4, k4, v4, s3, W)  # noqa: E731
    return timed(fn, (q4, k4, v4, s3), dout)


def run_padded(lens):
    B, m = len(lens), max(lens)
    g = torch.Generator(device="cuda").manual_seed(3)
    q = torch.randn(B, m, H, D, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_()
    k = torch.randn(B, m, HK, D, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_()
    v = torch.randn(B, m, HK, D, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_()
    s = torch.randn(B, HK, m, device="cuda", generator=g).requires_grad_()
    pad = torch.arange(m, device="cuda").view(1, m) < torch.tensor(lens, device="cuda").view(B, 1)
    dout = torch.randn_like(q)
    fn = lambda: flash_dma.dynamic_mask_attention(q, k, v, s, W, key_padding_mask=pad)  # noqa: E731
    return timed(fn, (q, k, v, s), dout)


def causal_pairs(lens):
    return sum(n * (n + 1) // 2 for n in lens)


def run_dense(lens):
    """Dense causal attention over a packed batch: ms (fwd, fwd+bwd) of attention_varlen and its
    baselines, each through autograd."""
    total, m, n_seqs = sum(lens), max(lens), len(lens)
    q, k, v, _ = tensors(total, 4)
    cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
    dout = torch.randn_like(q)
    res = {"varlen": timed(lambda: flash_dma.attention_varlen(q, k, v, cu, cu, m, m, is_causal=True), (q, k, v), dout)}
    uniform = len(set(lens)) == 1
    if uniform:  # one batched call
        def ours_other():
            return flash_dma.attention(q.view(n_seqs, m, H, D), k.view(n_seqs, m, HK, D), v.view(n_seqs, m, HK, D),
                                       is_causal=True).view(total, H, D)
    else:
        def ours_other():
            # split, not slices: its backward is one cat, not a zero-filled gradient per slice
            return torch.cat([flash_dma.attention(a[None], b[None], c[None], is_causal=True)[0]
                              for a, b, c in zip(q.split(lens), k.split(lens), v.split(lens))])
    res["ours_batched" if uniform else "ours_per_seq"] = timed(ours_other, (q, k, v), dout)
    # SDPA flash takes no GQA here: K/V heads repeated, as in bench_dma_causal.py.
    G = H // HK
    qt = q.detach().transpose(0, 1).contiguous().requires_grad_()  # [H, total, D]
    kt, vt = (t.detach().repeat_interleave(G, 1).transpose(0, 1).contiguous().requires_grad_() for t in (k, v))
    dt = dout.transpose(0, 1).contiguous()

    def sdpa_per_seq():
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            if uniform:
                view = lambda t: t.view(H, n_seqs, m, D).transpose(0, 1)  # noqa: E731
                o = F.scaled_dot_product_attention(view(qt), view(kt), view(vt), is_causal=True)
                return o.transpose(0, 1).reshape(H, total, D)
            return torch.cat([F.scaled_dot_product_attention(a[None], b[None], c[None], is_causal=True)[0]
                              for a, b, c in zip(qt.split(lens, 1), kt.split(lens, 1), vt.split(lens, 1))], dim=1)

    res["sdpa_batched" if uniform else "sdpa_per_seq"] = timed(sdpa_per_seq, (qt, kt, vt), dt)
    if not uniform:
        del qt, kt, vt, dt
        g = torch.Generator(device="cuda").manual_seed(5)
        qp, kp, vp = (torch.randn(n_seqs, H, m, D, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_()
                      for _ in range(3))
        dp = torch.randn_like(qp)

        def sdpa_padded():
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                return F.scaled_dot_product_attention(qp, kp, vp, is_causal=True)

        res["sdpa_padded"] = timed(sdpa_padded, (qp, kp, vp), dp)
    torch.cuda.empty_cache()
    return res


def kernel_times(fn, label):
    """Per-kernel GPU times (µs) of one call of fn, by the profiler."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    times = {}
    for e in prof.key_averages():
        if e.device_type.name == "CUDA" and e.device_time_total > 0:
            times[e.key[:60]] = times.get(e.key[:60], 0) + e.device_time_total
    total = sum(times.values())
    print(f"kernels of {label}: {total:.0f} us")
    for k, t in sorted(times.items(), key=lambda kv: -kv[1])[:12]:
        print(f"  {t:9.1f}  {k}")


def profile_both(lens):
    total, m = sum(lens), max(lens)
    q, k, v, s = tensors(total, 1)
    cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
    dout = torch.randn_like(q)

    def varlen():
        out = flash_dma.dynamic_mask_attention_varlen(q, k, v, s, cu, cu, m, m, W)
        torch.autograd.grad(out, (q, k, v, s), dout)

    q4, k4, v4 = (t.detach().unsqueeze(0).requires_grad_() for t in (q, k, v))
    s3 = s.detach().unsqueeze(0).requires_grad_()

    def one():
        out = flash_dma.dynamic_mask_attention(q4, k4, v4, s3, W)
        torch.autograd.grad(out, (q4, k4, v4, s3), dout.unsqueeze(0))

    kernel_times(varlen, f"varlen fwd+bwd, {len(lens)} sequences")
    kernel_times(one, f"one sequence of {total} fwd+bwd")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--dense-json")
    ap.add_argument("--only", choices=["dma", "dense"], help="run one of the two parts")
    ap.add_argument("--profile", action="store_true", help="per-kernel times of varlen and one sequence first")
    args = ap.parse_args()
    rows = []
    if args.profile:
        profile_both([32768 - 333, 24576 + 100, 20480 + 233, 16384 - 77, 12288 + 77, 10240, 8192 - 1000, 6144 + 1000])
        profile_both([128] * 1000)
    # 8 sequences from 1K to 32K tokens, 128K in all, lengths off every tile size
    eight = [32768 - 333, 24576 + 100, 20480 + 233, 16384 - 77, 12288 + 77, 10240, 8192 - 1000, 6144 + 1000]
    assert sum(eight) == 131072
    many = [128] * 1000
    configs = (("8 seqs, 1K-32K, 128K tokens", eight), ("1000 seqs x 128", many))
    for name, lens in configs if args.only != "dense" else ():
        vf, vb = run_varlen(lens)
        one_len = sum(lens)
        of, ob = run_one(one_len)
        pairs, one_pairs = kept_pairs(lens), kept_pairs([one_len])
        row = dict(config=name, pairs=pairs, varlen_fwd=vf, varlen_fwdbwd=vb, one_len=one_len, one_pairs=one_pairs,
                   one_fwd=of, one_fwdbwd=ob,
                   per_pair_ratio_fwdbwd=(vb / pairs) / (ob / one_pairs), per_pair_ratio_fwd=(vf / pairs) / (of / one_pairs))
        if len(lens) <= 8:
            pf, pb = run_padded(lens)
            row.update(padded_fwd=pf, padded_fwdbwd=pb, padded_speedup_fwdbwd=pb / vb)
        rows.append(row)
        print(row, flush=True)
    dense_rows = []
    for name, lens in configs if args.only != "dma" else ():
        res = run_dense(lens)
        pairs = causal_pairs(lens)
        row = dict(config=name, pairs=pairs, **{f"{k}_{p}": t for k, (f, b) in res.items() for p, t in (("fwd", f), ("fwdbwd", b))})
        row["tflops_fwd"] = 4 * pairs * H * D / (res["varlen"][0] * 1e-3) / 1e12
        row["tflops_fwdbwd"] = 10 * pairs * H * D / (res["varlen"][1] * 1e-3) / 1e12
        dense_rows.append(row)
        print(row, flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    if args.dense_json:
        with open(args.dense_json, "w") as f:
            json.dump(dense_rows, f, indent=1)
    if dense_rows:
        print("\ndense causal attention_varlen, ms fwd / fwd+bwd (TF/s of the varlen call)")
        for r in dense_rows:
            cells = [f"{k[:-4]} {r[k]:.3f}/{r[k[:-4] + '_fwdbwd']:.3f}" for k in r if k.endswith("_fwd") and k != "tflops_fwd"]
            print(f"{r['config']:30} " + "  ".join(cells) + f"  ({r['tflops_fwd']:.0f}/{r['tflops_fwdbwd']:.0f} TF/s)")
    if not rows:
        return
    print(f"\n{'config':30} {'pairs':>10} {'varlen fwd':>10} {'fwd+bwd':>9} {'one seq':>8} {'fwd+bwd':>8} "
          f"{'per pair':>8} {'padded':>8} {'speedup':>7}")
    for r in rows:
        print(f"{r['config']:30} {r['pairs'] / 1e6:9.1f}M {r['varlen_fwd']:10.3f} {r['varlen_fwdbwd']:9.3f} "
              f"{r['one_fwd']:8.3f} {r['one_fwdbwd']:8.3f} {r['per_pair_ratio_fwdbwd']:8.3f} "
              f"{r.get('padded_fwdbwd', float('nan')):8.3f} {r.get('padded_speedup_fwdbwd', float('nan')):7.2f}")


if __name__ == "__main__":
    main()
