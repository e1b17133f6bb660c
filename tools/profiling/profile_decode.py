"""One decode call per configuration, for Nsight Compute:
  ncu --kernel-name regex:select --set full python3 tools/profiling/profile_decode.py
Warm-up calls first (module load, workspace sizes), then one call under NVTX range "step"."""
import torch

import flash_dma


def call(B, H, Hk, K, D, w):
    k = torch.randn(B, K, Hk, D, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    s = torch.randn(B, Hk, K, device="cuda")
    q = torch.randn(B, 1, H, D, device="cuda", dtype=torch.bfloat16)
    lens = torch.full((B,), K, dtype=torch.int32, device="cuda")
    return lambda: flash_dma.dynamic_mask_attention_with_kvcache(q, k, v, s, lens, w)


for cfg in [(1, 32, 8, 4096, 128, 2048), (8, 32, 8, 131072, 128, 2048)]:
    f = call(*cfg)
    f()
    torch.cuda.synchronize()
    f()
    torch.cuda.synchronize()
