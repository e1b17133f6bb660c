"""The public functions: FlashAttention layout [batch, seqlen, heads, head_dim]; the tensors'
device picks the backend (CUDA tensors run the CUDA kernels, CPU tensors the CPU backend)."""
from collections import namedtuple

import torch

from . import _ops  # noqa: F401  (registers the torch.ops.flash_dma ops)
from ._library import library
from ._tensors import check_qkv, check_same_device, check_seqlens


def _as_4d(t, name, what):
    """A mask or bias broadcastable to [B, H, Sq, Sk]: lower-dim tensors gain leading 1s."""
    if t is None:
        return None
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{what}: {name} must be a torch.Tensor or None, got {type(t).__name__}")
    if t.dim() > 4:
        raise ValueError(f"{what}: {name} must have at most 4 dims [B, H, Sq, Sk], got shape {tuple(t.shape)}")
    while t.dim() < 4:
        t = t.unsqueeze(0)
    return t


def attention(q, k, v, attn_mask=None, attn_bias=None, is_causal=False, softmax_scale=None, softcap=0.0,
              deterministic=False, return_lse=False):
    """Attention with an optional boolean mask (True keeps) and additive bias, each broadcastable
    to [B, H, Sq, Sk] (heads 1, Hk or H). q [B, Sq, H, D]; k, v [B, Sk, Hk, D] with H % Hk == 0.
    score = softcap * tanh(scale * q.k / softcap) (or scale * q.k) + bias; causal is
    bottom-right aligned. Rows that see no key give 0. Returns out [B, Sq, H, D], and lse
    [B, H, Sq] (natural log, float32) when return_lse. Differentiable in q, k, v, attn_bias.
    deterministic=False lets the backward on Hopper sum dq with atomics (faster; its last bits
    may vary between runs); True keeps every gradient bitwise reproducible.
    """
    what = "flash_dma.attention"
    check_qkv(what, q, k, v)
    attn_mask, attn_bias = _as_4d(attn_mask, "attn_mask", what), _as_4d(attn_bias, "attn_bias", what)
    check_same_device(what, q, attn_mask=attn_mask, attn_bias=attn_bias)
    if attn_mask is not None and attn_mask.dtype != torch.bool:
        raise TypeError(f"{what}: attn_mask must be torch.bool (True keeps a score), got {attn_mask.dtype}")
    out, lse = torch.ops.flash_dma.attention_fwd(q, k, v, attn_mask, attn_bias, bool(is_causal),
                                                 float(softmax_scale or 0.0), float(softcap or 0.0),
                                                 bool(deterministic))
    return (out, lse) if return_lse else out


def dynamic_mask_attention(q, k, v, key_scores, window_size, is_causal=True, softmax_scale=None, softcap=0.0,
                           key_padding_mask=None, add_scores=True, deterministic=False, return_lse=False):
    """Each query keeps the top-`window_size` keys of its (batch, KV head) by key_scores
    [B, Hk, Sk] (among the keys it may see when causal; ties to the lower index; padding keys,
    False in key_padding_mask [B, Sk], are never kept) and attends to those alone, with the
    scores added to the kept scores when add_scores. Differentiable in q, k, v and key_scores
    (the selection itself is not). Returns out, and lse when return_lse.

    On CUDA, a call that needs no gradient with at most 16 queries, no key_padding_mask and
    deterministic=False runs on the decode path (dynamic_mask_attention_with_kvcache over full
    caches), which selects once per (batch, KV head) row and splits the kept keys across CTAs.
    With deterministic=False the backward on Hopper (head dim 64, 128 or 256) sums the gradients with
    atomics in fp32 temporaries (faster; their last bits may differ between runs).
    """
    what = "flash_dma.dynamic_mask_attention"
    check_qkv(what, q, k, v)
    return _dma(what, q, k, v, key_scores, key_padding_mask, window_size, is_causal, softmax_scale, softcap,
                add_scores, deterministic, return_lse, ())


def _dma(what, q, k, v, key_scores, key_padding_mask, window_size, is_causal, softmax_scale, softcap, add_scores,
         deterministic, return_lse, varlen):
    """The checks and the op call dynamic_mask_attention and its packed form share; varlen is
    () or (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)."""
    check_same_device(what, q, key_scores=key_scores, key_padding_mask=key_padding_mask)
    if isinstance(window_size, bool) or not isinstance(window_size, int) or window_size < 1:
        raise ValueError(f"{what}: window_size must be an integer >= 1, got {window_size!r}")
    if key_padding_mask is not None and key_padding_mask.dtype != torch.bool:
        raise TypeError(f"{what}: key_padding_mask must be torch.bool (True = the key exists), "
                        f"got {key_padding_mask.dtype}")
    # Without a gradient to come, no selection is kept for a backward, which lets the library
    # choose its path (the decode path on CUDA for a few queries).
    needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v, key_scores))
    out, lse, _, _ = torch.ops.flash_dma.dma_fwd(q, k, v, key_scores, key_padding_mask, window_size,
                                                 bool(is_causal), bool(add_scores), float(softmax_scale or 0.0),
                                                 float(softcap or 0.0), bool(deterministic), needs_grad, *varlen)
    return (out, lse) if return_lse else out


def _per_key(t, name, what, total_k):
    """A per-key tensor of a packed batch: [total_k] becomes [1, total_k]; [heads, total_k] stays."""
    if t is None:
        return None
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{what}: {name} must be a torch.Tensor or None, got {type(t).__name__}")
    if t.dim() == 1:
        t = t.unsqueeze(0)
    if t.dim() != 2 or t.shape[1] != total_k:
        raise ValueError(f"{what}: {name} must be [total_k] or [heads, total_k] with total_k = {total_k}, "
                         f"got shape {tuple(t.shape)}")
    return t


def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, key_bias=None, key_mask=None,
                     is_causal=False, softmax_scale=None, softcap=0.0, deterministic=False, return_lse=False):
    """attention over a packed variable-length batch (FlashAttention's flash_attn_varlen_func
    layout): q [total_q, H, D], k, v [total_k, Hk, D], sequence s owning rows
    [cu_seqlens[s], cu_seqlens[s + 1]) of each (int32 [num_seqs + 1]); max_seqlen_q/k are ints at
    least every sequence's length. Each sequence is its own problem (bottom-right causal per
    sequence). key_bias [total_k] or [1|Hk|H, total_k] is added to every score of its key
    (differentiable); key_mask (bool, same shapes) False hides a key. Returns out [total_q, H, D],
    and lse [H, total_q] when return_lse.
    """
    what = "flash_dma.attention_varlen"
    check_qkv(what, q, k, v, packed=True)
    check_seqlens(what, q, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    key_bias, key_mask = _per_key(key_bias, "key_bias", what, k.shape[0]), _per_key(key_mask, "key_mask", what, k.shape[0])
    check_same_device(what, q, key_bias=key_bias, key_mask=key_mask)
    if key_mask is not None and key_mask.dtype != torch.bool:
        raise TypeError(f"{what}: key_mask must be torch.bool (True keeps a key), got {key_mask.dtype}")
    out, lse = torch.ops.flash_dma.attention_fwd(q, k, v, key_mask, key_bias, bool(is_causal),
                                                 float(softmax_scale or 0.0), float(softcap or 0.0),
                                                 bool(deterministic), cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q),
                                                 int(max_seqlen_k))
    return (out, lse) if return_lse else out


def dynamic_mask_attention_varlen(q, k, v, key_scores, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                  window_size, is_causal=True, softmax_scale=None, softcap=0.0, key_padding_mask=None,
                                  add_scores=True, deterministic=False, return_lse=False):
    """dynamic_mask_attention over a packed variable-length batch: q [total_q, H, D], k, v
    [total_k, Hk, D], key_scores [Hk, total_k], key_padding_mask [total_k] (bool) and
    cu_seqlens / max_seqlen as in attention_varlen. Each query keeps the top-`window_size` keys
    of its own sequence (per KV head; causal: among those it may see). Differentiable in q, k,
    v and key_scores. Returns out [total_q, H, D], and lse [H, total_q] when return_lse.
    """
    what = "flash_dma.dynamic_mask_attention_varlen"
    check_qkv(what, q, k, v, packed=True)
    check_seqlens(what, q, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    return _dma(what, q, k, v, key_scores, key_padding_mask, window_size, is_causal, softmax_scale, softcap,
                add_scores, deterministic, return_lse,
                (cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q), int(max_seqlen_k)))


class Selection(namedtuple("Selection", ["begin", "end"])):
    """Which queries keep which keys: query i keeps key j of (b, hk) iff
    begin[b, hk, j] <= i < end[b, hk, j] (int32 [B, Hk, Sk]; an empty interval = never kept).
    For a causal top-w selection these intervals are exact: once a key falls out of a query's
    top-w it never returns."""

    def kept(self, num_queries):
        """The selection as a dense bool [B, Hk, num_queries, Sk] (for inspection; O(Sq * Sk))."""
        i = torch.arange(num_queries, device=self.begin.device).view(1, 1, -1, 1)
        return (self.begin.unsqueeze(2) <= i) & (i < self.end.unsqueeze(2))


def select_keys(key_scores, window_size, num_queries=None, is_causal=True, key_padding_mask=None):
    """The selection dynamic_mask_attention makes, as a Selection of per-key query intervals."""
    what = "flash_dma.select_keys"
    if not isinstance(key_scores, torch.Tensor) or key_scores.dim() != 3:
        raise ValueError(f"{what}: key_scores must be a [B, Hk, Sk] tensor")
    if isinstance(window_size, bool) or not isinstance(window_size, int) or window_size < 1:
        raise ValueError(f"{what}: window_size must be an integer >= 1, got {window_size!r}")
    check_same_device(what, key_scores, key_padding_mask=key_padding_mask)
    sq = key_scores.shape[2] if num_queries is None else int(num_queries)
    begin, end = torch.ops.flash_dma.select(key_scores, key_padding_mask, sq, window_size, bool(is_causal))
    return Selection(begin, end)


def _check_kvcache(what, q, k_cache, v_cache, cache_seqlens, block_table, k, v, window_size=None):
    check_qkv(what, q, k_cache, v_cache)
    check_same_device(what, q, cache_seqlens=cache_seqlens, block_table=block_table, k=k, v=v)
    if cache_seqlens is not None and (not isinstance(cache_seqlens, torch.Tensor) or cache_seqlens.dtype != torch.int32
                                      or cache_seqlens.dim() != 1):
        raise TypeError(f"{what}: cache_seqlens must be an int32 tensor [batch] (or None: every cache is full)")
    if block_table is not None and block_table.dtype != torch.int32:
        raise TypeError(f"{what}: block_table must be an int32 tensor [batch, max_pages], got {block_table.dtype}")
    if (k is None) != (v is None):
        raise ValueError(f"{what}: k and v go together: give both or neither")
    if window_size is not None and (isinstance(window_size, bool) or not isinstance(window_size, int) or window_size < 1):
        raise ValueError(f"{what}: window_size must be an integer >= 1, got {window_size!r}")


def dynamic_mask_attention_with_kvcache(q, k_cache, v_cache, score_cache, cache_seqlens, window_size,
                                        block_table=None, k=None, v=None, scores=None, softmax_scale=None,
                                        softcap=0.0, return_lse=False, is_causal=True, add_scores=True,
                                        select_state=None):
    """Decode (or chunked prefill) against a KV cache, each query keeping the top-`window_size`
    cached keys it may see by their score, as FlashAttention's flash_attn_with_kvcache lays the
    cache out. q [B, Sq, H, D]; k_cache, v_cache [B, max_len, Hk, D] and score_cache
    [B, Hk, max_len], or paged [num_pages, page_size, Hk, D] / [num_pages, page_size, Hk] with
    block_table [B, max_pages] int32; cache_seqlens [B] int32 (None: every cache is full). New tokens k, v [B, Snew, Hk, D]
    and scores [B, Hk, Snew] are written into the caches at cache_seqlens first (advance
    cache_seqlens yourself afterwards). Query i then sits at position L - Sq + i of its
    sequence's L = cache_seqlens + Snew keys. No host synchronization: CUDA-graph capturable.
    select_state (from new_select_state, passed to every step of a generation loop) lets a
    decode step update each row's kept set with its new keys instead of selecting over the
    whole cache; the result is the same. Returns out [B, Sq, H, D], and lse [B, H, Sq] when
    return_lse.
    """
    what = "flash_dma.dynamic_mask_attention_with_kvcache"
    _check_kvcache(what, q, k_cache, v_cache, cache_seqlens, block_table, k, v, window_size)
    check_same_device(what, q, score_cache=score_cache, scores=scores)
    if score_cache is None:
        raise ValueError(f"{what}: score_cache is required (attention_with_kvcache is the dense variant)")
    check_same_device(what, q, select_state=select_state)
    if select_state is not None and (not isinstance(select_state, torch.Tensor) or select_state.dtype != torch.int32):
        raise TypeError(f"{what}: select_state must be an int32 tensor [B, Hk, 1 + 2 * min(window_size, capacity)] "
                        f"(flash_dma.new_select_state makes one), got {getattr(select_state, 'dtype', select_state)!r}")
    out, lse = torch.ops.flash_dma.kvcache_fwd(q, k_cache, v_cache, score_cache, cache_seqlens, block_table, k, v,
                                               scores, select_state, window_size, bool(is_causal), bool(add_scores),
                                               float(softmax_scale or 0.0), float(softcap or 0.0))
    return (out, lse) if return_lse else out


def attention_with_kvcache(q, k_cache, v_cache, cache_seqlens, block_table=None, k=None, v=None, softmax_scale=None,
                           softcap=0.0, return_lse=False, is_causal=True):
    """Dense attention against a KV cache (every cached key), with the same cache layouts,
    appending and position rules as dynamic_mask_attention_with_kvcache."""
    what = "flash_dma.attention_with_kvcache"
    _check_kvcache(what, q, k_cache, v_cache, cache_seqlens, block_table, k, v)
    out, lse = torch.ops.flash_dma.kvcache_fwd(q, k_cache, v_cache, None, cache_seqlens, block_table, k, v, None, None, 0,
                                               bool(is_causal), False, float(softmax_scale or 0.0),
                                               float(softcap or 0.0))
    return (out, lse) if return_lse else out


def new_select_state(k_cache, window_size, block_table=None):
    """A zeroed select_state for dynamic_mask_attention_with_kvcache on this cache: int32
    [B, Hk, 1 + 2 * min(window_size, capacity)], on the cache's device. Per (sequence, KV head)
    row it holds a prefix length n, the positions of the top-window_size keys of [0, n) and
    their scores (float32 bits: the library's copy, which a decode step reads instead of
    gathering them from the cache; never edit it); zeros
    mean "select from scratch". Keep passing it while the cached scores below n stay as they
    are (appending through the call and rolling cache_seqlens back both keep that); zero a
    sequence's rows before reusing its slot or writing its scores by other means."""
    if block_table is None:
        batch, capacity = k_cache.shape[0], k_cache.shape[1]
    else:
        batch, capacity = block_table.shape[0], block_table.shape[1] * k_cache.shape[1]
    slots = min(int(window_size), int(capacity))
    return torch.zeros((batch, k_cache.shape[2], 1 + 2 * slots), dtype=torch.int32, device=k_cache.device)


def get_available_backends():
    """Backends this build can run now: "cpu" always, "cuda" with a usable GPU."""
    return ["cpu"] + (["cuda"] if library().fdma_cuda_available() else [])
