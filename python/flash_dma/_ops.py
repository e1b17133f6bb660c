"""The torch.library ops over the C ABI: schema, real implementation (ctypes call on the
tensors' device and current stream, every buffer allocated by torch), fake implementation
(shapes only, for torch.compile), and autograd.

Ops (namespace flash_dma): attention_fwd, attention_bwd, dma_fwd, dma_bwd, select, kvcache_fwd.
attention and dma take a packed variable-length batch (fdma.h, "varlen") when cu_seqlens_q and
cu_seqlens_k are given: q [total_q, H, D], k, v [total_k, Hk, D], lse [H, total_q].
"""
import ctypes
from typing import Optional, Tuple

import torch
from torch import Tensor

from . import _abi
from ._library import check, library
from ._tensors import pack, stream_of, workspace

# Workspace sizes by (operation, device, packed params without pointers): a size
# depends on shapes and flags alone, and asking the library for it costs as much as the launch.
_workspace_sizes = {}


def _run(fn, size_fn, params, key, pass_, device, what):
    """Sets the stream, gives params a torch-allocated workspace and calls fn."""
    params.stream = stream_of(device)
    cache_key = (what, device, key)
    nbytes = _workspace_sizes.get(cache_key)
    if nbytes is None:
        n = ctypes.c_size_t(0)
        if pass_ is None:
            check(size_fn(ctypes.byref(params), ctypes.byref(n)), what)
        else:
            check(size_fn(ctypes.byref(params), pass_, ctypes.byref(n)), what)
        nbytes = n.value
        if len(_workspace_sizes) > 1024:
            _workspace_sizes.clear()
        _workspace_sizes[cache_key] = nbytes
    ws = workspace(nbytes, device)
    params.workspace, params.workspace_bytes = ws.data_ptr(), nbytes
    check(fn(ctypes.byref(params)), what)


def _lse_shape(q):
    """[B, H, Sq] for q [B, Sq, H, D]; [H, total_q] for a packed q [total_q, H, D]."""
    return (q.shape[1], q.shape[0]) if q.dim() == 3 else (q.shape[0], q.shape[2], q.shape[1])


def _lse_dtype(q):
    return torch.float64 if q.dtype == torch.float64 else torch.float32


def _out_and_lse(q):
    return (torch.empty(q.shape, dtype=q.dtype, device=q.device),
            torch.empty(_lse_shape(q), dtype=_lse_dtype(q), device=q.device))


def _grad_like(t):
    # Dense gradients in the input's shape (expanded, stride-0 views get a full-size gradient).
    return torch.empty(t.shape, dtype=t.dtype, device=t.device)


# --- attention ---------------------------------------------------------------------------

def _attention(pass_, q, k, v, mask, bias, causal, scale, softcap, deterministic, varlen, out, lse,
               dout=None, dq=None, dk=None, dv=None, dbias=None):
    lib = library()
    cu_q, cu_k, max_q, max_k = varlen
    params, key = pack(_abi.AttentionParams,
                       (("q", q), ("k", k), ("v", v), ("mask", mask), ("bias", bias), ("out", out), ("lse", lse),
                        ("dout", dout), ("dq", dq), ("dk", dk), ("dv", dv), ("dbias", dbias),
                        ("cu_seqlens_q", cu_q), ("cu_seqlens_k", cu_k)),
                       causal=causal, scale=scale, softcap=softcap, deterministic=deterministic,
                       max_seqlen_q=max_q, max_seqlen_k=max_k)
    forward = pass_ == _abi.PASS_FORWARD
    _run(lib.fdma_attention_fwd if forward else lib.fdma_attention_bwd, lib.fdma_attention_workspace_size,
         params, key, pass_, q.device, "attention" if forward else "attention backward")


@torch.library.custom_op("flash_dma::attention_fwd", mutates_args=())
def attention_fwd(q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor], bias: Optional[Tensor], causal: bool,
                  scale: float, softcap: float, deterministic: bool, cu_seqlens_q: Optional[Tensor] = None,
                  cu_seqlens_k: Optional[Tensor] = None, max_seqlen_q: int = 0,
                  max_seqlen_k: int = 0) -> Tuple[Tensor, Tensor]:
    out, lse = _out_and_lse(q)
    _attention(_abi.PASS_FORWARD, q, k, v, mask, bias, causal, scale, softcap, deterministic,
               (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k), out, lse)
    return out, lse


@attention_fwd.register_fake
def _(q, k, v, mask, bias, causal, scale, softcap, deterministic, cu_seqlens_q=None, cu_seqlens_k=None,
      max_seqlen_q=0, max_seqlen_k=0):
    return q.new_empty(q.shape), q.new_empty(_lse_shape(q), dtype=_lse_dtype(q))


@torch.library.custom_op("flash_dma::attention_bwd", mutates_args=())
def attention_bwd(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor], bias: Optional[Tensor],
                  out: Tensor, lse: Tensor, causal: bool, scale: float, softcap: float, deterministic: bool,
                  want_dbias: bool, cu_seqlens_q: Optional[Tensor] = None, cu_seqlens_k: Optional[Tensor] = None,
                  max_seqlen_q: int = 0, max_seqlen_k: int = 0) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    dq, dk, dv = _grad_like(q), _grad_like(k), _grad_like(v)
    dbias = _grad_like(bias) if (want_dbias and bias is not None) else None
    _attention(_abi.PASS_BACKWARD, q, k, v, mask, bias, causal, scale, softcap, deterministic,
               (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k), out, lse, dout, dq, dk, dv, dbias)
    return dq, dk, dv, (dbias if dbias is not None else q.new_empty(0))


@attention_bwd.register_fake
def _(dout, q, k, v, mask, bias, out, lse, causal, scale, softcap, deterministic, want_dbias, cu_seqlens_q=None,
      cu_seqlens_k=None, max_seqlen_q=0, max_seqlen_k=0):
    dbias = bias.new_empty(bias.shape) if (want_dbias and bias is not None) else q.new_empty(0)
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), dbias


def _attention_setup(ctx, inputs, output):
    q, k, v, mask, bias, causal, scale, softcap, deterministic, cu_q, cu_k, max_q, max_k = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, mask, bias, out, lse, cu_q, cu_k)
    ctx.args = (causal, scale, softcap, deterministic, max_q, max_k)
    ctx.mark_non_differentiable(lse)


def _attention_backward(ctx, dout, _dlse):
    q, k, v, mask, bias, out, lse, cu_q, cu_k = ctx.saved_tensors
    causal, scale, softcap, deterministic, max_q, max_k = ctx.args
    want_dbias = bias is not None and ctx.needs_input_grad[4]
    if dout.stride(-1) != 1:
        dout = dout.contiguous()
    dq, dk, dv, dbias = torch.ops.flash_dma.attention_bwd(dout, q, k, v, mask, bias, out, lse, causal, scale, softcap,
                                                          deterministic, want_dbias, cu_q, cu_k, max_q, max_k)
    return (dq, dk, dv, None, (dbias if want_dbias else None)) + (None,) * (len(ctx.needs_input_grad) - 5)


torch.library.register_autograd("flash_dma::attention_fwd", _attention_backward, setup_context=_attention_setup)


# --- dynamic_mask_attention ----------------------------------------------------------------

def _dma(pass_, q, k, v, key_scores, key_padding, window, causal, add_scores, scale, softcap, deterministic, varlen,
         out, lse, keep_begin, keep_end, dout=None, dq=None, dk=None, dv=None, dkey_scores=None):
    lib = library()
    cu_q, cu_k, max_q, max_k = varlen
    params, key = pack(_abi.DmaParams,
                       (("q", q), ("k", k), ("v", v), ("key_scores", key_scores), ("key_padding", key_padding),
                        ("out", out), ("lse", lse), ("dout", dout), ("dq", dq), ("dk", dk), ("dv", dv),
                        ("dkey_scores", dkey_scores), ("keep_begin", keep_begin), ("keep_end", keep_end),
                        ("cu_seqlens_q", cu_q), ("cu_seqlens_k", cu_k)),
                       window=window, causal=causal, add_scores=add_scores, scale=scale, softcap=softcap,
                       deterministic=deterministic, max_seqlen_q=max_q, max_seqlen_k=max_k)
    forward = pass_ == _abi.PASS_FORWARD
    _run(lib.fdma_dma_fwd if forward else lib.fdma_dma_bwd, lib.fdma_dma_workspace_size, params, key, pass_,
         q.device, "dynamic_mask_attention" if forward else "dynamic_mask_attention backward")


def _intervals_like(key_scores):
    return (torch.empty(key_scores.shape, dtype=torch.int32, device=key_scores.device),
            torch.empty(key_scores.shape, dtype=torch.int32, device=key_scores.device))


# The forward also returns its selection (keep_begin, keep_end: 8 bytes per key), which
# autograd saves so that the backward does not select again. keep_selection=False (no
# gradient to come) returns them empty and leaves the library free to choose its path: on
# CUDA, calls with few queries then run on the decode path (docs/decode.md).
@torch.library.custom_op("flash_dma::dma_fwd", mutates_args=())
def dma_fwd(q: Tensor, k: Tensor, v: Tensor, key_scores: Tensor, key_padding: Optional[Tensor], window: int,
            causal: bool, add_scores: bool, scale: float, softcap: float, deterministic: bool,
            keep_selection: bool = True, cu_seqlens_q: Optional[Tensor] = None, cu_seqlens_k: Optional[Tensor] = None,
            max_seqlen_q: int = 0, max_seqlen_k: int = 0) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    out, lse = _out_and_lse(q)
    varlen = (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    if keep_selection:
        keep_begin, keep_end = _intervals_like(key_scores)
        _dma(_abi.PASS_FORWARD, q, k, v, key_scores, key_padding, window, causal, add_scores, scale, softcap,
             deterministic, varlen, out, lse, keep_begin, keep_end)
        return out, lse, keep_begin, keep_end
    _dma(_abi.PASS_FORWARD, q, k, v, key_scores, key_padding, window, causal, add_scores, scale, softcap,
         deterministic, varlen, out, lse, None, None)
    none = key_scores.new_empty((0,), dtype=torch.int32)
    return out, lse, none, none.clone()


@dma_fwd.register_fake
def _(q, k, v, key_scores, key_padding, window, causal, add_scores, scale, softcap, deterministic,
      keep_selection=True, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=0, max_seqlen_k=0):
    lse = q.new_empty(_lse_shape(q), dtype=_lse_dtype(q))
    shape = key_scores.shape if keep_selection else (0,)
    return (q.new_empty(q.shape), lse, key_scores.new_empty(shape, dtype=torch.int32),
            key_scores.new_empty(shape, dtype=torch.int32))


# keep_begin/keep_end: the forward's selection, or None to select again.
@torch.library.custom_op("flash_dma::dma_bwd", mutates_args=())
def dma_bwd(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, key_scores: Tensor, key_padding: Optional[Tensor],
            out: Tensor, lse: Tensor, keep_begin: Optional[Tensor], keep_end: Optional[Tensor], window: int,
            causal: bool, add_scores: bool, scale: float, softcap: float, deterministic: bool,
            cu_seqlens_q: Optional[Tensor] = None, cu_seqlens_k: Optional[Tensor] = None, max_seqlen_q: int = 0,
            max_seqlen_k: int = 0) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    dq, dk, dv, dscores = _grad_like(q), _grad_like(k), _grad_like(v), _grad_like(key_scores)
    _dma(_abi.PASS_BACKWARD, q, k, v, key_scores, key_padding, window, causal, add_scores, scale, softcap,
         deterministic, (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k), out, lse, keep_begin, keep_end,
         dout, dq, dk, dv, dscores)
    return dq, dk, dv, dscores


@dma_bwd.register_fake
def _(dout, q, k, v, key_scores, key_padding, out, lse, keep_begin, keep_end, window, causal, add_scores, scale,
      softcap, deterministic, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=0, max_seqlen_k=0):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), key_scores.new_empty(key_scores.shape)


def _dma_setup(ctx, inputs, output):
    q, k, v, key_scores, key_padding, window, causal, add_scores, scale, softcap, deterministic = inputs[:11]
    cu_q, cu_k, max_q, max_k = inputs[12:16]
    out, lse, keep_begin, keep_end = output
    ctx.save_for_backward(q, k, v, key_scores, key_padding, out, lse, keep_begin, keep_end, cu_q, cu_k)
    ctx.args = (window, causal, add_scores, scale, softcap, deterministic, max_q, max_k)
    ctx.mark_non_differentiable(lse, keep_begin, keep_end)


def _dma_backward(ctx, dout, _dlse, _dbegin, _dend):
    q, k, v, key_scores, key_padding, out, lse, keep_begin, keep_end, cu_q, cu_k = ctx.saved_tensors
    window, causal, add_scores, scale, softcap, deterministic, max_q, max_k = ctx.args
    if dout.stride(-1) != 1:
        dout = dout.contiguous()
    if keep_begin.numel() == 0:  # a forward that kept no selection: the backward selects again
        keep_begin = keep_end = None
    dq, dk, dv, dscores = torch.ops.flash_dma.dma_bwd(dout, q, k, v, key_scores, key_padding, out, lse, keep_begin,
                                                      keep_end, window, causal, add_scores, scale, softcap,
                                                      deterministic, cu_q, cu_k, max_q, max_k)
    return (dq, dk, dv, (dscores if ctx.needs_input_grad[3] else None)) + (None,) * (len(ctx.needs_input_grad) - 4)


torch.library.register_autograd("flash_dma::dma_fwd", _dma_backward, setup_context=_dma_setup)


# --- select --------------------------------------------------------------------------------

@torch.library.custom_op("flash_dma::select", mutates_args=())
def select(key_scores: Tensor, key_padding: Optional[Tensor], num_queries: int, window: int,
           causal: bool) -> Tuple[Tensor, Tensor]:
    lib = library()
    begin = torch.empty(key_scores.shape, dtype=torch.int32, device=key_scores.device)
    end = torch.empty_like(begin)
    params, key = pack(_abi.SelectParams, (("key_scores", key_scores), ("key_padding", key_padding),
                                           ("keep_begin", begin), ("keep_end", end)),
                       num_queries=num_queries, window=window, causal=causal)
    _run(lib.fdma_select, lib.fdma_select_workspace_size, params, key, None, key_scores.device, "select_keys")
    return begin, end


@select.register_fake
def _(key_scores, key_padding, num_queries, window, causal):
    return (key_scores.new_empty(key_scores.shape, dtype=torch.int32),
            key_scores.new_empty(key_scores.shape, dtype=torch.int32))


# --- attention against a KV cache (inference; forward only) -------------------------------

# The caches are written in place when new tokens (k, v, scores) are given; select_state
# is rewritten by every call that gets it.
@torch.library.custom_op("flash_dma::kvcache_fwd", mutates_args=("k_cache", "v_cache", "score_cache", "select_state"))
def kvcache_fwd(q: Tensor, k_cache: Tensor, v_cache: Tensor, score_cache: Optional[Tensor],
                cache_seqlens: Optional[Tensor],
                block_table: Optional[Tensor], k: Optional[Tensor], v: Optional[Tensor], scores: Optional[Tensor],
                select_state: Optional[Tensor], window: int, causal: bool, add_scores: bool, scale: float,
                softcap: float) -> Tuple[Tensor, Tensor]:
    lib = library()
    out, lse = _out_and_lse(q)
    params, key = pack(_abi.KvCacheParams,
                       (("q", q), ("k_cache", k_cache), ("v_cache", v_cache), ("score_cache", score_cache),
                        ("cache_seqlens", cache_seqlens), ("block_table", block_table), ("k", k), ("v", v),
                        ("scores", scores), ("select_state", select_state), ("out", out), ("lse", lse)),
                       window=window, causal=causal, add_scores=add_scores, scale=scale, softcap=softcap)
    _run(lib.fdma_kvcache_fwd, lib.fdma_kvcache_workspace_size, params, key, None, q.device, "kvcache attention")
    return out, lse


@kvcache_fwd.register_fake
def _(q, k_cache, v_cache, score_cache, cache_seqlens, block_table, k, v, scores, select_state, window, causal,
      add_scores, scale, softcap):
    B, Sq, H, _ = q.shape
    return q.new_empty(q.shape), q.new_empty((B, H, Sq), dtype=torch.float32 if q.dtype != torch.float64 else q.dtype)
