"""One decode call per configuration, for Nsight Compute:
  ncu --kernel-name regex:select --set full python3 tools/profiling/profile_decode.py
Warm-up calls first (module load, workspace sizes), then one call under NVTX range "step".
With --state (--state64): twelve steady-state B8 H32 Hk8 128K (B64 32K) decode steps that keep a
select_state
  ncu --kernel-name select_state_kernel --launch-skip 8 --launch-count 1 --set full \
      python3 tools/profiling/profile_decode.py --state"""
import os
import sys

import torch

import flash_dma


def call(B, H, Hk, K, D, w):
    k = torch.randn(B, K, Hk, D, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    s = torch.randn(B, Hk, K, device="cuda")
    q = torch.randn(B, 1, H, D, device="cuda", dtype=torch.bfloat16)
    lens = torch.full((B,), K, dtype=torch.int32, device="cuda")
    return lambda: flash_dma.dynamic_mask_attention_with_kvcache(q, k, v, s, lens, w)


if "--state" in sys.argv or "--state64" in sys.argv:
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
    import bench_decode

    B, K = (64, 32768) if "--state64" in sys.argv else (8, 131072)  # the serving batch, or B8 128K
    sets = bench_decode.make_sets(B, K + 64, 8, 128, 0, 1, seed=5)
    q = torch.randn(B, 1, 32, 128, device="cuda", dtype=torch.bfloat16)
    step = bench_decode.state_step(q, 2048, dict(sets[0], K=K), 1)
    for _ in range(12):
        step()
    torch.cuda.synchronize()
    sys.exit(0)

for cfg in [(1, 32, 8, 4096, 128, 2048), (8, 32, 8, 131072, 128, 2048)]:
    f = call(*cfg)
    f()
    torch.cuda.synchronize()
    f()
    torch.cuda.synchronize()
