"""Model building blocks."""
import torch
import torch.nn.functional as F

from ._api import dynamic_mask_attention


class DynamicMaskAttention(torch.nn.Module):
    """Dynamic mask attention with learnable key importance, as in the DMA papers:
    key_scores[b, hk, j] = A[hk] * softplus(dt_proj(v[b, j, :, :].flatten()))[hk], then each
    query keeps its top-`window_size` keys by those scores (causal-aware) and attends to them,
    the scores added as a bias so that A and dt_proj learn through dynamic_mask_attention's
    gradient to key_scores.

    forward(q [B, Sq, H, D], k, v [B, Sk, Hk, D], key_padding_mask=None) -> [B, Sq, H, D]

    With a process_group, the sequence is sharded across its ranks (context parallelism,
    flash_dma.distributed): each rank passes its contiguous shard (q, k, v and the padding
    mask of the same positions) and gets its shard of the output. The parameters' gradients
    are then each rank's share, to be all-reduced over the group as in data parallelism.
    """

    def __init__(self, num_heads, num_kv_heads, head_dim, window_size, is_causal=True, softcap=0.0, device=None,
                 dtype=None, process_group=None):
        super().__init__()
        if num_heads % num_kv_heads:
            raise ValueError(f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads})")
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.window_size, self.is_causal, self.softcap = window_size, is_causal, softcap
        self.process_group = process_group
        self.A = torch.nn.Parameter(torch.ones(num_kv_heads, device=device, dtype=dtype))
        self.dt_proj = torch.nn.Linear(num_kv_heads * head_dim, num_kv_heads, device=device, dtype=dtype)

    def key_scores(self, v):
        B, Sk = v.shape[0], v.shape[1]
        dt = self.dt_proj(v.reshape(B, Sk, self.num_kv_heads * self.head_dim))  # [B, Sk, Hk]
        return (self.A * F.softplus(dt)).transpose(1, 2)  # [B, Hk, Sk]

    def forward(self, q, k, v, key_padding_mask=None):
        scores = self.key_scores(v)
        if scores.dtype not in (torch.float32, q.dtype):
            scores = scores.float()
        if self.process_group is not None:
            from . import distributed

            return distributed.dynamic_mask_attention(q, k, v, scores, self.window_size, group=self.process_group,
                                                      is_causal=self.is_causal, softcap=self.softcap,
                                                      key_padding_mask=key_padding_mask)
        return dynamic_mask_attention(q, k, v, scores, self.window_size, is_causal=self.is_causal, softcap=self.softcap,
                                      key_padding_mask=key_padding_mask)
