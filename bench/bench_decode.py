"""Decode against long KV caches: flash_dma.dynamic_mask_attention_with_kvcache against dense
SDPA flash over the whole cache and torch topk + gather + SDPA over the kept keys, in one run.

Every system runs captured in a CUDA graph (as a serving loop runs it) and is timed by events
over many replays; each call reads its own copy of the caches, rotated so that the bytes one
call touches are not in L2 from the call before. Prints a table (and --json writes it):
  ms per call, the kept K/V + scores bytes over the time (GB/s), and ours against each baseline.

  python bench/bench_decode.py                 # the issue's configurations
  python bench/bench_decode.py --sweep         # latency against cache length (plot data)

"state ms" is a steady-state decode step that keeps a select_state (it appends its token and
grows each row's kept set instead of selecting over the whole cache).
"""
import argparse
import json
import math
import os

import torch
import torch.nn.functional as F

import flash_dma

L2_BYTES = 50 * 2 ** 20


def make_sets(B, K, Hk, D, page_size, count, seed):
    # Caches are allocated as a serving engine allocates its pool, from memory no earlier
    # configuration's freed tensors fragment: a B64 cache allocated while freed blocks of an
    # earlier configuration sat in torch's cache gathered 14% slower (docs/performance.md, "Decode").
    torch.cuda.empty_cache()
    sets = []
    g = torch.Generator(device="cuda").manual_seed(seed)
    for _ in range(count):
        if page_size:
            pages = B * ((K + page_size - 1) // page_size)
            perm = torch.randperm(pages, device="cuda", generator=g).to(torch.int32)
            table = perm.view(B, -1)
            k = torch.randn(pages, page_size, Hk, D, device="cuda", dtype=torch.bfloat16, generator=g)
            v = torch.randn(pages, page_size, Hk, D, device="cuda", dtype=torch.bfloat16, generator=g)
            s = torch.randn(pages, page_size, Hk, device="cuda", generator=g)
            sets.append(dict(k_cache=k, v_cache=v, score_cache=s, block_table=table))
        else:
            k = torch.randn(B, K, Hk, D, device="cuda", dtype=torch.bfloat16, generator=g)
            v = torch.randn(B, K, Hk, D, device="cuda", dtype=torch.bfloat16, generator=g)
            s = torch.randn(B, Hk, K, device="cuda", generator=g)
            sets.append(dict(k_cache=k, v_cache=v, score_cache=s))
    return sets


def graph_time(fns, reps=20):
    """ms per call of fns (called in turn), captured once and replayed."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for f in fns:
            f()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(reps):
            for f in fns:
                f()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(7):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) / (reps * len(fns)))
    times.sort()
    return times[len(times) // 2]


STATE_ROOM = 200  # steps' appends past K a select_state run has room for (warm-up + 8 x 20 replays a set)


def state_step(q, w, c, Sq):
    """One decode step of a generation loop that keeps a select_state: appends Sq new tokens
    at the set's own cache_seqlens, attends, advances cache_seqlens (all inside the graph)."""
    B, _, H, D = q.shape
    Hk = c["k_cache"].shape[2]
    lens = torch.full((B,), c["K"], dtype=torch.int32, device="cuda")
    kn = torch.randn(B, Sq, Hk, D, device="cuda", dtype=torch.bfloat16)
    vn = torch.randn(B, Sq, Hk, D, device="cuda", dtype=torch.bfloat16)
    sn = torch.randn(B, Hk, Sq, device="cuda")
    cache = {k: v for k, v in c.items() if k != "K"}
    state = flash_dma.new_select_state(cache["k_cache"], w, cache.get("block_table"))

    def f():
        out = flash_dma.dynamic_mask_attention_with_kvcache(q, cache_seqlens=lens, window_size=w, k=kn, v=vn,
                                                            scores=sn, select_state=state, **cache)
        lens.add_(Sq)
        return out
    return f


def run_config(B, H, Hk, K, D, w, Sq=1, page_size=0, baselines=True, with_state=True, plain=True):
    G = H // Hk
    kept = min(w, K)
    touched = B * Hk * (K * 4 + kept * D * 2 * 2)  # scores + kept K/V rows
    count = max(1, min(16, math.ceil(2 * L2_BYTES / touched)))
    cache_bytes = B * K * Hk * D * 2 * 2
    count = max(1, min(count, int(20e9 // max(cache_bytes, 1))))
    sets = make_sets(B, K, Hk, D, page_size, count, seed=K + B)
    lens = torch.full((B,), K, dtype=torch.int32, device="cuda")
    q = torch.randn(B, Sq, H, D, device="cuda", dtype=torch.bfloat16)
    row = dict(B=B, H=H, Hk=Hk, K=K, D=D, w=w, Sq=Sq, page=page_size, sets=count)

    def ours(c):
        return lambda: flash_dma.dynamic_mask_attention_with_kvcache(q, cache_seqlens=lens, window_size=w, **c)

    if plain:
        row["ours_ms"] = graph_time([ours(c) for c in sets])
        row["ours_GBps"] = touched / row["ours_ms"] / 1e6
    if with_state:
        # Steady-state decode steps keeping a select_state: the kept K/V rows are the bytes
        # that must move (the state and the w gathered scores add 3% at D 128).
        del sets
        ssets = make_sets(B, K + STATE_ROOM * Sq, Hk, D, page_size, count, seed=K + B + 1)
        steps = [state_step(q, w, dict(c, K=K), Sq) for c in ssets]
        row["state_ms"] = graph_time(steps)
        row["state_GBps"] = B * Hk * kept * D * 2 * 2 / row["state_ms"] / 1e6
        del ssets, steps
        sets = make_sets(B, K, Hk, D, page_size, count, seed=K + B) if baselines and not page_size else []
    if not baselines or page_size:
        return row

    # Dense flash over the whole cache (GQA through SDPA's enable_gqa).
    def dense(c):
        kk, vv = c["k_cache"].transpose(1, 2), c["v_cache"].transpose(1, 2)
        qq = q.transpose(1, 2)

        def f():
            with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.FLASH_ATTENTION):
                return F.scaled_dot_product_attention(qq, kk, vv, enable_gqa=True)
        return f

    try:
        row["dense_flash_ms"] = graph_time([dense(c) for c in sets])
    except RuntimeError as e:  # noqa: PERF203
        row["dense_flash_ms"] = float("nan")
        print("dense flash failed:", str(e).splitlines()[0])

    # torch topk + gather + SDPA over the kept keys (Sq = 1: every query keeps the same keys).
    def topk(c):
        kk, vv, ss = c["k_cache"], c["v_cache"], c["score_cache"]
        qq = q.transpose(1, 2)  # [B, H, Sq, D]

        def f():
            idx = torch.topk(ss, kept, dim=-1).indices  # [B, Hk, w]
            kg = torch.gather(kk.transpose(1, 2), 2, idx.unsqueeze(-1).expand(-1, -1, -1, D))
            vg = torch.gather(vv.transpose(1, 2), 2, idx.unsqueeze(-1).expand(-1, -1, -1, D))
            bias = torch.gather(ss, 2, idx).repeat_interleave(G, 1).unsqueeze(2).to(q.dtype)
            return F.scaled_dot_product_attention(qq, kg.repeat_interleave(G, 1), vg.repeat_interleave(G, 1),
                                                  attn_mask=bias)
        return f

    if Sq == 1:
        row["topk_ms"] = graph_time([topk(c) for c in sets])
        ref = topk(sets[0])().transpose(1, 2).float()
        got = ours(sets[0])().float()
        row["max_diff_vs_topk"] = (ref - got).abs().max().item()
    return row


def dense_ours(B, H, Hk, K, D):
    """ms of attention_with_kvcache over K cached keys (position order), caches rotated."""
    count = max(1, min(16, math.ceil(2 * L2_BYTES / (B * Hk * K * D * 4))))
    sets = make_sets(B, K, Hk, D, 0, count, seed=7)
    lens = torch.full((B,), K, dtype=torch.int32, device="cuda")
    q = torch.randn(B, 1, H, D, device="cuda", dtype=torch.bfloat16)

    def f(c):
        return lambda: flash_dma.attention_with_kvcache(q, c["k_cache"], c["v_cache"], lens)
    return graph_time([f(c) for c in sets])


def dma_entry(B, H, Hk, K, D, w):
    """ms of flash_dma.dynamic_mask_attention with one query and no gradient (the decode path)
    against the training forward (torch.ops.flash_dma.dma_fwd) on the same tensors."""
    c = make_sets(B, K, Hk, D, 0, 1, seed=11)[0]
    q = torch.randn(B, 1, H, D, device="cuda", dtype=torch.bfloat16)
    k, v, s = c["k_cache"], c["v_cache"], c["score_cache"]

    def decode():
        with torch.no_grad():
            return flash_dma.dynamic_mask_attention(q, k, v, s, w)

    def training():
        return torch.ops.flash_dma.dma_fwd(q, k, v, s, None, w, True, True, 0.0, 0.0, False)

    row = dict(B=B, H=H, Hk=Hk, K=K, D=D, w=w, decode_ms=graph_time([decode]), training_ms=graph_time([training]))
    row["max_diff"] = (decode().float() - training()[0].float()).abs().max().item()
    print(f"dynamic_mask_attention, Sq 1, B{B} H{H} Hk{Hk} K{K} D{D} w{w}: decode path {row['decode_ms']:.4f} ms, "
          f"training forward {row['training_ms']:.4f} ms, max diff {row['max_diff']:.4f}")
    return row


def prefill_chunk(B, H, Hk, K, D, w, chunk, causal=True):
    """ms of a chunk of `chunk` queries at the end of a K-key cache through the KV-cache call,
    without a select_state and with one that describes the keys before the chunk (restored
    before each call, as the previous chunk of a prompt leaves it; the copy is timed too),
    against dynamic_mask_attention's training forward on the same tensors (same kept pairs)."""
    c = make_sets(B, K, Hk, D, 0, 1, seed=13)[0]
    q = torch.randn(B, chunk, H, D, device="cuda", dtype=torch.bfloat16)
    k, v, s = c["k_cache"], c["v_cache"], c["score_cache"]
    # The state of [0, K - chunk), what the previous chunk would leave: a call whose cache ends there.
    start = flash_dma.new_select_state(k, w)
    before = torch.full((B,), K - chunk, dtype=torch.int32, device="cuda")
    flash_dma.dynamic_mask_attention_with_kvcache(q[:, :1], k, v, s, before, w, select_state=start)
    state = start.clone()
    lens = torch.full((B,), K, dtype=torch.int32, device="cuda")

    def cache_call():
        return flash_dma.dynamic_mask_attention_with_kvcache(q, k, v, s, lens, w, is_causal=causal)

    def state_call():
        state.copy_(start)
        return flash_dma.dynamic_mask_attention_with_kvcache(q, k, v, s, lens, w, select_state=state, is_causal=causal)

    def training():
        return torch.ops.flash_dma.dma_fwd(q, k, v, s, None, w, causal, True, 0.0, 0.0, False)

    row = dict(B=B, H=H, Hk=Hk, K=K, D=D, w=w, chunk=chunk, causal=causal, kvcache_ms=graph_time([cache_call], reps=5),
               state_ms=graph_time([state_call], reps=5), training_ms=graph_time([training], reps=5))
    ref = training()[0].float()
    row["max_diff"] = max((cache_call().float() - ref).abs().max().item(),
                          (state_call().float() - ref).abs().max().item())
    print(f"chunked prefill{'' if causal else ', non-causal'}, {chunk} queries after {K - chunk} cached keys, "
          f"B{B} H{H} Hk{Hk} D{D} w{w}: "
          f"KV-cache call {row['kvcache_ms']:.3f} ms, with select_state {row['state_ms']:.3f} ms, "
          f"training forward {row['training_ms']:.3f} ms, max diff {row['max_diff']:.4f}", flush=True)
    return row


def kernel_name(name):
    """A profiler's kernel name without namespaces, return type and arguments; template
    arguments kept only for the selection passes (their pass number)."""
    name = name.replace("(anonymous namespace)::", "").replace("void ", "").replace("fdma::cuda::", "")
    return name.split("(")[0].split("<")[0] + ("<" + name.split("<")[1].split(">")[0] + ">" if "pass" in name else "")


def profile_calls(f, reps, each_alone=False):
    """The torch profiler (CUDA activity) over `reps` calls of f, after 3 warm-up calls;
    each_alone: every call waits for its kernels, so that no two calls' kernels overlap."""
    for _ in range(3):
        f()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            f()
            if each_alone:
                torch.cuda.synchronize()
        torch.cuda.synchronize()
    return prof


def kernel_events(prof):
    """The profiler's kernel (CUDA) events."""
    return [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]


def kernel_spans(prof):
    """(start, end, name) of every kernel the profiler saw, by start (us, the GPU's clock)."""
    return sorted((e.time_range.start, e.time_range.end, kernel_name(e.name)) for e in kernel_events(prof))


def kernel_times(f, reps=10):
    """Device µs per call of each kernel f launches (profiler over `reps` calls)."""
    per = {}
    for e in kernel_events(profile_calls(f, reps)):
        us = e.device_time if hasattr(e, "device_time") else e.cuda_time
        name = kernel_name(e.name)
        per[name] = per.get(name, 0.0) + us / reps
    return per


def kernel_breakdown(B, H, Hk, K, D, w, with_state=False):
    """Per-kernel device time of one call (µs, from the profiler over 10 calls), and the
    selection's share (its kernels and the scratch memset). with_state: steady-state decode
    steps that keep a select_state (each appends a token)."""
    q = torch.randn(B, 1, H, D, device="cuda", dtype=torch.bfloat16)
    if with_state:
        sets = make_sets(B, K + STATE_ROOM, Hk, D, 0, 1, seed=3)
        f = state_step(q, w, dict(sets[0], K=K), 1)
    else:
        sets = make_sets(B, K, Hk, D, 0, 1, seed=3)
        lens = torch.full((B,), K, dtype=torch.int32, device="cuda")
        f = lambda: flash_dma.dynamic_mask_attention_with_kvcache(q, cache_seqlens=lens, window_size=w, **sets[0])  # noqa
    per = kernel_times(f)
    sel = sum(v for n, v in per.items() if "select" in n or "emset" in n)
    print(f"kernels of one call, B{B} Hk{Hk} K{K} w{w}{' (select_state)' if with_state else ''}: " +
          ", ".join(f"{n.strip()} {v:.1f}" for n, v in per.items()))
    print(f"  selection {sel:.1f} us of {sum(per.values()):.1f} us of kernel time")
    return sel, sum(per.values())


def ab(spec, rounds):
    """Libraries or switch settings against each other: each variant's --tune-one run in its own
    process, the order rotated each round so that drift hits all alike; medians per config."""
    import re
    import statistics
    import subprocess
    import sys
    variants = []
    for item in spec.split(","):
        label, rest = item.split("=", 1)
        lib, *envs = rest.split(":")
        variants.append((label, dict(os.environ, FDMA_LIBRARY=os.path.abspath(lib), **dict(e.split("=", 1) for e in envs))))
    times = {}
    for r in range(rounds):
        for label, env in variants[r % len(variants):] + variants[:r % len(variants)]:
            out = subprocess.run([sys.executable, __file__, "--tune-one"], env=env, capture_output=True, text=True)
            for line in out.stdout.splitlines():
                m = re.match(r"ctas/SM \S+: (.*): ([0-9.]+) ms", line)
                if m:
                    times.setdefault(m.group(1), {}).setdefault(label, []).append(float(m.group(2)))
            if out.returncode:
                print(label, "failed:", out.stderr[-2000:])
    labels = [v[0] for v in variants]
    print("| config | " + " | ".join(labels) + " |")
    print("|---|" + "---|" * len(labels))
    for cfg, per in times.items():
        print(f"| {cfg} | " + " | ".join(f"{statistics.median(per[lb]):.4f}" if lb in per else "-" for lb in labels) + " |")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--json")
    ap.add_argument("--quick", action="store_true", help="ours alone on the two latency configurations")
    ap.add_argument("--tune", action="store_true", help="select_state steps against FDMA_DECODE_CTAS_PER_SM")
    ap.add_argument("--tune-one", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--ab", help="variants label=LIBRARY[:VAR=VALUE...], comma-separated: their select_state "
                    "steps (the --tune configurations) in rotated rounds, one process a run")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--breakdown", action="store_true", help="per-kernel times of the B8 and B64 select_state steps")
    ap.add_argument("--prefill", action="store_true", help="chunked prefill against the training forward")
    ap.add_argument("--dma", action="store_true", help="dynamic_mask_attention's decode path against its training one")
    args = ap.parse_args()
    rows = []
    if args.tune:  # one process per setting: the Python layer caches workspace sizes per shape
        import subprocess
        import sys
        for per_sm in (2, 3, 4, 6, 8):
            env = dict(os.environ, FDMA_DECODE_CTAS_PER_SM=str(per_sm))
            subprocess.run([sys.executable, __file__, "--tune-one"], env=env, check=False)
        return
    if args.breakdown:
        kernel_breakdown(8, 32, 8, 131072, 128, 2048, with_state=True)
        kernel_breakdown(64, 32, 8, 32768, 128, 2048, with_state=True)
        return
    if args.ab:
        ab(args.ab, args.rounds)
        return
    if args.tune_one:
        per_sm = os.environ.get("FDMA_DECODE_CTAS_PER_SM")
        for cfg in ((8, 32, 8, 131072, 128, 2048), (64, 32, 8, 32768, 128, 2048), (1, 2, 1, 524288, 64, 1024)):
            r = run_config(*cfg, baselines=False, plain=False)
            print(f"ctas/SM {per_sm}: B{cfg[0]} K{cfg[3]}: {r['state_ms']:.4f} ms, {r['state_GBps']:.0f} GB/s", flush=True)
        for B in (8, 64):  # the same bytes read in position order: dense attention over 2048 cached keys
            ms = dense_ours(B, 32, 8, 2048, 128)
            print(f"ctas/SM {per_sm}: dense B{B} K2048: {ms:.4f} ms, {B * 8 * 2048 * 128 * 4 / ms / 1e6:.0f} GB/s",
                  flush=True)
        return
    if args.prefill:
        rows = [prefill_chunk(1, 16, 4, 32768, 128, 2048, chunk) for chunk in (32, 256, 1024, 4096)]
        rows += [prefill_chunk(1, 16, 4, 32768, 128, 2048, chunk, causal=False) for chunk in (32, 1024, 4096)]
        q = torch.randn(1, 4096, 16, 128, device="cuda", dtype=torch.bfloat16)
        c = make_sets(1, 32768, 4, 128, 0, 1, seed=13)[0]
        lens = torch.full((1,), 32768, dtype=torch.int32, device="cuda")
        per = kernel_times(lambda: flash_dma.dynamic_mask_attention_with_kvcache(q, cache_seqlens=lens,
                                                                                 window_size=2048, **c))
        print("kernels of the 4096-query chunk (no state), us: " + ", ".join(f"{n} {v:.1f}" for n, v in per.items()))
        if args.json:
            with open(args.json, "w") as f:
                json.dump(rows, f, indent=1)
        return
    if args.dma:
        dma_entry(8, 32, 8, 131072, 128, 2048)
        dma_entry(1, 2, 1, 524288, 64, 1024)
        return
    if args.quick:
        kernel_breakdown(8, 32, 8, 131072, 128, 2048)
        kernel_breakdown(8, 32, 8, 131072, 128, 2048, with_state=True)
        rows.append(run_config(8, 32, 8, 131072, 128, 2048, baselines=False))
        rows.append(run_config(1, 2, 1, 524288, 64, 1024, baselines=False))
        rows.append(run_config(8, 32, 8, 131072, 128, 2048, page_size=64))
        rows.append(run_config(64, 32, 8, 32768, 128, 2048, baselines=False, plain=False))
        rows.append(run_config(8, 32, 8, 131072, 128, 2048, Sq=4, baselines=False, plain=False))
    elif args.sweep:
        for K in [4096, 16384, 65536, 262144, 1048576]:
            rows.append(run_config(1, 32, 8, K, 128, 2048))
    else:
        rows.append(run_config(8, 32, 8, 131072, 128, 2048))
        rows.append(run_config(1, 2, 1, 524288, 64, 1024))
        rows.append(run_config(64, 32, 8, 32768, 128, 2048))
        rows.append(run_config(8, 32, 8, 131072, 128, 2048, Sq=4, baselines=False))
        for page in (16, 64):
            rows.append(run_config(8, 32, 8, 131072, 128, 2048, page_size=page))
        kernel_breakdown(8, 32, 8, 131072, 128, 2048)
        kernel_breakdown(8, 32, 8, 131072, 128, 2048, with_state=True)
    nan = float("nan")
    print(f"{'config':<40} {'ours ms':>8} {'GB/s':>6} {'state ms':>8} {'GB/s':>6} {'dense':>7} {'topk':>7} {'diff':>7}")
    for r in rows:
        name = f"B{r['B']} H{r['H']} Hk{r['Hk']} K{r['K']} D{r['D']} w{r['w']} Sq{r['Sq']} p{r['page']}"
        print(f"{name:<40} {r.get('ours_ms', nan):8.4f} {r.get('ours_GBps', nan):6.0f} {r.get('state_ms', nan):8.4f} "
              f"{r.get('state_GBps', nan):6.0f} {r.get('dense_flash_ms', nan):7.4f} {r.get('topk_ms', nan):7.4f} "
              f"{r.get('max_diff_vs_topk', nan):7.4f}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1)


if __name__ == "__main__":
    main()
