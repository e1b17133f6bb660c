"""The causal dynamic-mask problem the benchmark and profiling scripts share (the headline shape:
B1 H16 Hk4 D128 w2048 bf16, float32 key scores, by default): inputs drawn from seed 0, outputs and gradients
allocated, and the library's DmaParams pointing at them (no workspace, no kept selection: each
script sets those as it measures)."""
import ctypes
from types import SimpleNamespace

import torch

from bench_attention import view
from flash_dma import _abi


def dma_problem(S, device="cuda", causal=1, B=1, H=16, Hk=4, D=128, w=2048, dtype=torch.bfloat16,
                score_dtype=torch.float32):
    torch.manual_seed(0)
    t = SimpleNamespace()
    t.q = torch.randn(B, S, H, D, device=device, dtype=dtype)
    t.k = torch.randn(B, S, Hk, D, device=device, dtype=dtype)
    t.v = torch.randn(B, S, Hk, D, device=device, dtype=dtype)
    t.dout = torch.randn_like(t.q)
    t.scores = torch.randn(B, Hk, S, device=device, dtype=score_dtype)
    t.out, t.lse = torch.empty_like(t.q), torch.empty(B, H, S, device=device, dtype=torch.float32)
    t.dq, t.dk, t.dv, t.dscores = (torch.empty_like(x) for x in (t.q, t.k, t.v, t.scores))
    p = _abi.DmaParams()
    p.q, p.k, p.v, p.key_scores, p.out, p.lse = view(t.q), view(t.k), view(t.v), view(t.scores), view(t.out), view(t.lse)
    p.dout, p.dq, p.dk, p.dv, p.dkey_scores = view(t.dout), view(t.dq), view(t.dk), view(t.dv), view(t.dscores)
    p.window, p.causal, p.add_scores = w, causal, 1
    if t.q.is_cuda:
        p.stream = torch.cuda.current_stream().cuda_stream
    t.params = p
    return t


def attach_workspace(runs, device="cuda"):
    """One device workspace for every (library, DmaParams) pair in `runs`, sized for the most
    either pass of any of them needs, set on each params; returns it (keep it alive)."""
    sizes = [0]
    for lib, params in runs:
        for ps in (_abi.PASS_FORWARD, _abi.PASS_BACKWARD):
            n = ctypes.c_size_t(0)
            if lib.fdma_dma_workspace_size(ctypes.byref(params), ps, ctypes.byref(n)) != 0:
                raise RuntimeError(lib.fdma_last_error().decode())
            sizes.append(n.value)
    ws = torch.empty(max(sizes), device=device, dtype=torch.uint8)
    for _, params in runs:
        params.workspace, params.workspace_bytes = ws.data_ptr(), ws.numel()
    return ws
