"""Model building blocks."""
import torch
import torch.nn.functional as F

from ._api import dynamic_mask_attention, dynamic_mask_attention_varlen


class DynamicMaskAttention(torch.nn.Module):
    """Dynamic mask attention with learnable key importance, as in the DMA papers:
    key_scores[b, hk, j] = A[hk] * softplus(dt_proj(v[b, j, :, :].flatten()))[hk], then each
    query keeps its top-`window_size` keys by those scores (causal-aware) and attends to them,
    the scores added as a bias so that A and dt_proj learn through dynamic_mask_attention's
    gradient to key_scores.

    forward(q [B, Sq, H, D], k, v [B, Sk, Hk, D], key_padding_mask=None) -> [B, Sq, H, D]
    forward(q [total_q, H, D], k, v [total_k, Hk, D], cu_seqlens_q=..., cu_seqlens_k=...,
            max_seqlen_q=..., max_seqlen_k=...) -> [total_q, H, D]: a packed batch
            (dynamic_mask_attention_varlen), key_padding_mask then [total_k]

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
        """[B, Hk, Sk] for v [B, Sk, Hk, D]; [Hk, total_k] for a packed v [total_k, Hk, D]."""
        lead = v.shape[:-2]
        dt = self.dt_proj(v.reshape(*lead, self.num_kv_heads * self.head_dim))  # [..., Sk, Hk]
        return (self.A * F.softplus(dt)).transpose(-1, -2)

    def forward(self, q, k, v, key_padding_mask=None, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None,
                max_seqlen_k=None):
        scores = self.key_scores(v)
        if scores.dtype not in (torch.float32, q.dtype):
            scores = scores.float()
        if cu_seqlens_q is not None or cu_seqlens_k is not None:
            if self.process_group is not None:
                raise ValueError("DynamicMaskAttention: packed batches (cu_seqlens) and a process_group do not combine")
            return dynamic_mask_attention_varlen(q, k, v, scores, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                                 self.window_size, is_causal=self.is_causal, softcap=self.softcap,
                                                 key_padding_mask=key_padding_mask)
        if self.process_group is not None:
            from . import distributed

            return distributed.dynamic_mask_attention(q, k, v, scores, self.window_size, group=self.process_group,
                                                      is_causal=self.is_causal, softcap=self.softcap,
                                                      key_padding_mask=key_padding_mask)
        return dynamic_mask_attention(q, k, v, scores, self.window_size, is_causal=self.is_causal, softcap=self.softcap,
                                      key_padding_mask=key_padding_mask)
