"""flash_dma.distributed against the single-process call: processes spawned with
torch.multiprocessing, the gloo backend on the CPU backend (always), NCCL with one GPU a
process (with --device cuda and two GPUs or more). Every process builds the whole problem from
one seed, computes the single-process result and its gradients, and checks its shard of the
distributed result against them: the output, dq, dk, dv, dkey_scores (dkey_bias)."""
import os
import sys
import tempfile
import traceback

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))


def _run(world, fn, args, backend="gloo", limit=240):
    """fn(rank, world, *args) in `world` processes; raises if any of them failed. A rank that
    fails can leave its peers waiting in a collective, so the first reported failure ends the
    run (after a grace period for the peers' own reports), and every report is shown."""
    import queue
    import time

    with tempfile.TemporaryDirectory() as tmp:
        ctx = mp.get_context("spawn")
        errors = ctx.Queue()
        procs = [ctx.Process(target=_worker, args=(r, world, backend, os.path.join(tmp, "store"), fn, args, errors))
                 for r in range(world)]
        for p in procs:
            p.start()
        failures, deadline, grace = [], time.monotonic() + limit, None
        while any(p.is_alive() for p in procs) and time.monotonic() < (grace or deadline):
            try:
                failures.append(errors.get(timeout=0.2))
                grace = grace or time.monotonic() + 10
            except queue.Empty:
                pass
        hung = [r for r, p in enumerate(procs) if p.is_alive()]
        for p in procs:
            if p.is_alive():
                p.kill()
            p.join()
        while True:
            try:
                failures.append(errors.get(timeout=0.2))
            except queue.Empty:
                break
        assert not failures, "\n".join(failures) + (f"\n(ranks {hung} were still running)" if hung else "")
        assert not hung, f"ranks {hung} did not finish within {limit} s (a collective left waiting?)"
        assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]


def _worker(rank, world, backend, store, fn, args, errors):
    try:
        if backend == "nccl":
            torch.cuda.set_device(rank)
        dist.init_process_group(backend, init_method=f"file://{store}", rank=rank, world_size=world)
        fn(rank, world, *args)
        dist.barrier()  # no rank tears its group down while a peer still talks to it
    except BaseException:  # noqa: BLE001  (reported to the parent, which fails the test)
        # Reported before any teardown: destroying an NCCL group while a peer waits in a
        # collective blocks, and the report would never leave. The parent ends this process.
        errors.put(f"rank {rank}:\n{traceback.format_exc()}")
        return
    dist.destroy_process_group()
    # Past this point the rank has passed; skip the interpreter's teardown, where torch's C++
    # statics abort now and then ("terminate called without an active exception", no Python
    # frame left: about 1 run in 5 with gloo on the CPU).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _problem(seed, B, N, H, Hk, D, dtype, device, bias_heads=None):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, N, H, D, generator=g).to(device, dtype)
    k = torch.randn(B, N, Hk, D, generator=g).to(device, dtype)
    v = torch.randn(B, N, Hk, D, generator=g).to(device, dtype)
    # Distinct scores (no ties), so that summation order cannot move a selection.
    s = (torch.randperm(B * Hk * N, generator=g).float().view(B, Hk, N) / (B * Hk * N)).to(device)
    dout = torch.randn(B, N, H, D, generator=g).to(device, dtype)
    bias = None if bias_heads is None else torch.randn(B, bias_heads, N, generator=g).to(device)
    return q, k, v, s, dout, bias


def _leaves(*ts):
    return [None if t is None else t.detach().clone().requires_grad_(t.is_floating_point()) for t in ts]


def _close(name, got, want, rank, atol, rtol=0.0):
    assert got.shape == want.shape, (name, got.shape, want.shape)
    if not got.numel():
        return
    err = (got.float() - want.float()).abs() - rtol * want.float().abs()
    worst = err.argmax()
    assert err.flatten()[worst] <= atol, (
        f"rank {rank}: {name} differs from the single-process result by "
        f"{(got.float() - want.float()).abs().flatten()[worst].item()} at a value of "
        f"{want.float().flatten()[worst].item()} (tolerance {atol} + {rtol} x |value|)")


def _dma_case(rank, world, lengths, causal, padded, dtype_name, device_name):
    import flash_dma
    import flash_dma.distributed as fd

    device = torch.device(device_name, rank) if device_name == "cuda" else torch.device("cpu")
    dtype = getattr(torch, dtype_name)
    B, H, Hk, D, w, N = 2, 4, 2, 32, 12, sum(lengths)
    q, k, v, s, dout, _ = _problem(7, B, N, H, Hk, D, dtype, device)
    pad = None
    if padded:
        pad = torch.ones(B, N, dtype=torch.bool, device=device)
        pad[0, N // 3: N // 3 + 5] = False
        pad[1, -3:] = False
    # The single-process result.
    q1, k1, v1, s1 = _leaves(q, k, v, s)
    out1 = flash_dma.dynamic_mask_attention(q1, k1, v1, s1, w, is_causal=causal, key_padding_mask=pad)
    out1.backward(dout)
    # This rank's shard.
    a, b = sum(lengths[:rank]), sum(lengths[: rank + 1])
    q2, k2, v2 = _leaves(q[:, a:b], k[:, a:b], v[:, a:b])
    s2 = s[:, :, a:b].clone().requires_grad_(True)
    out2 = fd.dynamic_mask_attention(q2, k2, v2, s2, w, is_causal=causal,
                                     key_padding_mask=None if pad is None else pad[:, a:b].contiguous())
    out2.backward(dout[:, a:b])
    # Half precision: a key gradient is the sum of the ranks' partial gradients, each rounded
    # to half precision before the sum. Partials of opposite signs can be larger than their
    # sum, so the error is bounded by a rounding step of the gradients' scale, not of each value.
    def tol(want):
        if dtype == torch.float32:
            return 2e-5, 0.0
        return 1e-2 + 2.0 ** -6 * want.float().abs().max().item(), 1e-2
    for name, got, want in (("out", out2, out1[:, a:b]), ("dq", q2.grad, q1.grad[:, a:b]),
                            ("dk", k2.grad, k1.grad[:, a:b]), ("dv", v2.grad, v1.grad[:, a:b]),
                            ("dkey_scores", s2.grad, s1.grad[:, :, a:b])):
        _close(name, got, want, rank, *tol(want))


def _attention_case(rank, world, lengths, causal, bias_heads):
    import flash_dma
    import flash_dma.distributed as fd

    B, H, Hk, D, N = 2, 4, 2, 16, sum(lengths)
    q, k, v, _, dout, bias = _problem(11, B, N, H, Hk, D, torch.float32, torch.device("cpu"), bias_heads)
    q1, k1, v1, b1 = _leaves(q, k, v, bias)
    out1 = flash_dma.attention(q1, k1, v1, attn_bias=None if b1 is None else b1.unsqueeze(2), is_causal=causal)
    out1.backward(dout)
    a, b = sum(lengths[:rank]), sum(lengths[: rank + 1])
    q2, k2, v2 = _leaves(q[:, a:b], k[:, a:b], v[:, a:b])
    b2 = None if bias is None else bias[:, :, a:b].clone().requires_grad_(True)
    out2 = fd.attention(q2, k2, v2, key_bias=b2, is_causal=causal)
    out2.backward(dout[:, a:b])
    _close("out", out2, out1[:, a:b], rank, 2e-5)
    _close("dq", q2.grad, q1.grad[:, a:b], rank, 2e-5)
    _close("dk", k2.grad, k1.grad[:, a:b], rank, 2e-5)
    _close("dv", v2.grad, v1.grad[:, a:b], rank, 2e-5)
    if bias is not None:
        _close("dkey_bias", b2.grad, b1.grad[:, :, a:b], rank, 2e-5)


def _bad_case(rank, world, kind):
    import flash_dma.distributed as fd

    n, B, H, Hk, D = 8, 1, 2, 1, 16
    q, k, v, s, _, _ = _problem(3, B, n, H, Hk, D, torch.float32, torch.device("cpu"))
    w = 4
    if kind == "window" and rank == 1:
        w = 5
    if kind == "head_dim" and rank == 1:
        q, k, v = q[..., :8].contiguous(), k[..., :8].contiguous(), v[..., :8].contiguous()
    if kind == "local" and rank == 1:
        s = s[:, :, :-1]  # key_scores shorter than the shard: invalid on this rank only
    with pytest.raises(ValueError) as e:
        fd.dynamic_mask_attention(q, k, v, s, w)
    msg = str(e.value)
    expected = {"window": "other shapes, dtypes or arguments", "head_dim": "other shapes, dtypes or arguments",
                "local": "invalid"}[kind]
    assert expected in msg, msg
    if kind == "local" and rank == 1:
        assert "key_scores" in msg, msg
    # The group is still usable: the failed call left no collective half-done.
    t = torch.ones(1)
    dist.all_reduce(t)
    assert t.item() == world


def _subgroup_case(rank, world):
    import flash_dma.distributed as fd

    group = dist.new_group([0, 2])
    if rank == 1:
        q, k, v, s, _, _ = _problem(5, 1, 6, 2, 1, 16, torch.float32, torch.device("cpu"))
        with pytest.raises(ValueError, match="not a member"):
            fd.dynamic_mask_attention(q, k, v, s, 4, group=group)
        return
    _dma_subgroup(rank, group)


def _dma_subgroup(rank, group):
    import flash_dma
    import flash_dma.distributed as fd

    lengths = [20, 13]  # group ranks 0 and 1 are world ranks 0 and 2
    grank = dist.get_rank(group)
    N = sum(lengths)
    q, k, v, s, dout, _ = _problem(9, 1, N, 4, 2, 16, torch.float32, torch.device("cpu"))
    q1, k1, v1, s1 = _leaves(q, k, v, s)
    out1 = flash_dma.dynamic_mask_attention(q1, k1, v1, s1, 6)
    out1.backward(dout)
    a, b = sum(lengths[:grank]), sum(lengths[: grank + 1])
    q2, k2, v2 = _leaves(q[:, a:b], k[:, a:b], v[:, a:b])
    s2 = s[:, :, a:b].clone().requires_grad_(True)
    out2 = fd.dynamic_mask_attention(q2, k2, v2, s2, 6, group=group)
    out2.backward(dout[:, a:b])
    _close("out", out2, out1[:, a:b], rank, 2e-5)
    _close("dk", k2.grad, k1.grad[:, a:b], rank, 2e-5)
    _close("dkey_scores", s2.grad, s1.grad[:, :, a:b], rank, 2e-5)


def _module_case(rank, world, lengths):
    import flash_dma

    torch.manual_seed(0)
    full = flash_dma.nn.DynamicMaskAttention(4, 2, 16, window_size=6)
    shard = flash_dma.nn.DynamicMaskAttention(4, 2, 16, window_size=6, process_group=dist.group.WORLD)
    shard.load_state_dict(full.state_dict())
    N = sum(lengths)
    q, k, v, _, dout, _ = _problem(13, 1, N, 4, 2, 16, torch.float32, torch.device("cpu"))
    full(q, k, v).backward(dout)
    a, b = sum(lengths[:rank]), sum(lengths[: rank + 1])
    out = shard(q[:, a:b], k[:, a:b], v[:, a:b])
    out.backward(dout[:, a:b])
    # Parameter gradients are per-rank partial sums (as in data parallelism): all-reduced, they
    # equal the single-process ones.
    for (name, p_full), p_shard in zip(full.named_parameters(), shard.parameters()):
        g = p_shard.grad.clone()
        dist.all_reduce(g)
        _close(f"d{name}", g, p_full.grad, rank, 2e-5)


def _cases(rank, world, cases):
    """Several cases in one set of processes (spawning them costs seconds on a CI machine)."""
    for fn, args in cases:
        fn(rank, world, *args)


def test_two_ranks():
    """Ragged shards, causal and not, bf16 (gradients summed in bf16); arguments that disagree across ranks or are invalid on one
    (a clear error on every rank, and the group still usable); the nn module with a group."""
    _run(2, _cases, ([(_dma_case, ([37, 27], True, False, "float32", "cpu")),
                      (_dma_case, ([37, 27], False, False, "float32", "cpu")),
                      (_dma_case, ([37, 27], True, True, "bfloat16", "cpu")),
                      (_bad_case, ("window",)), (_bad_case, ("head_dim",)), (_bad_case, ("local",)),
                      (_module_case, ([19, 22],))],))


def test_three_ranks():
    """An empty shard and key padding, every shard empty, equal shards; attention with per-key bias (KV-head, broadcast and no
    bias); a subgroup of world ranks 0 and 2, and a call from a rank outside it."""
    _run(3, _cases, ([(_dma_case, ([30, 0, 25], True, True, "float32", "cpu")),
                      (_dma_case, ([0, 0, 0], True, False, "float32", "cpu")),
                      (_dma_case, ([16, 16, 16], False, False, "float32", "cpu")),
                      (_attention_case, ([21, 17, 26], True, 2)), (_attention_case, ([21, 17, 26], False, 1)),
                      (_attention_case, ([21, 17, 26], True, None)), (_subgroup_case, ())],))


def test_needs_initialized_process_group():
    import flash_dma.distributed as fd

    x = torch.zeros(1, 4, 2, 16)
    with pytest.raises(RuntimeError, match="not initialized"):
        fd.dynamic_mask_attention(x, x[:, :, :1], x[:, :, :1], torch.zeros(1, 1, 4), 2)


def test_nccl_two_gpus(device):
    if device.type != "cuda" or torch.cuda.device_count() < 2:
        pytest.skip("needs --device cuda and two GPUs")
    _run(2, _dma_case, ([700, 540], True, False, "bfloat16", "cuda"), backend="nccl")


def test_context_parallel_example_under_torchrun(device):
    """examples/context_parallel.py as its docstring launches it (torchrun, gloo on the CPU
    backend, or NCCL with --device cuda and two GPUs): it checks its ranks' output and
    parameter gradients against one process and prints the differences."""
    import re
    import subprocess

    cuda = device.type == "cuda"
    if cuda and torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    root = os.path.join(os.path.dirname(__file__), "..", "..")
    env = dict(os.environ, PYTHONPATH=os.path.join(root, "python") + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           os.path.join(root, "examples", "context_parallel.py"), "--tokens", "512"] + ([] if cuda else ["--cpu"])
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
    m = re.search(r"2 ranks, 512 tokens: output max abs diff (\S+), parameter gradients max relative diff (\S+)",
                  run.stdout)
    assert m, run.stdout[-2000:]
    out_diff, grad_diff = float(m.group(1)), float(m.group(2))
    assert out_diff <= (2e-2 if cuda else 1e-5), out_diff
    assert grad_diff <= (2e-2 if cuda else 1e-4), grad_diff
