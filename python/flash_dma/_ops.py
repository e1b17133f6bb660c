"""The torch.library ops over the C ABI: schema, real implementation (ctypes call on the
tensors' device and current stream, every buffer allocated by torch), fake implementation
(shapes only, for torch.compile), and autograd.

Ops (namespace flash_dma): attention_fwd, attention_bwd, dma_fwd, dma_bwd, select.
"""
import ctypes
from typing import Optional, Tuple

import torch
from torch import Tensor

from . import _abi
from ._library import check, library
from ._tensors import stream_of, view, workspace


def _workspace_size(fn, params, pass_, what):
    n = ctypes.c_size_t(0)
    check(fn(ctypes.byref(params), pass_, ctypes.byref(n)), what)
    return n.value


def _grad_like(t):
    # Dense gradients in the input's shape (expanded, stride-0 views get a full-size gradient).
    return torch.empty(t.shape, dtype=t.dtype, device=t.device)


# --- attention ---------------------------------------------------------------------------

def _attention_params(q, k, v, mask, bias, causal, scale, softcap, deterministic):
    p = _abi.AttentionParams()
    p.q, p.k, p.v, p.mask, p.bias = view(q), view(k), view(v), view(mask), view(bias)
    p.causal, p.scale, p.softcap, p.deterministic = int(causal), float(scale), float(softcap), int(deterministic)
    p.stream = stream_of(q)
    return p


@torch.library.custom_op("flash_dma::attention_fwd", mutates_args=())
def attention_fwd(q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor], bias: Optional[Tensor], causal: bool,
                  scale: float, softcap: float, deterministic: bool) -> Tuple[Tensor, Tensor]:
    lib = library()
    B, Sq, H, _ = q.shape
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty((B, H, Sq), dtype=torch.float32 if q.dtype != torch.float64 else torch.float64, device=q.device)
    p = _attention_params(q, k, v, mask, bias, causal, scale, softcap, deterministic)
    p.out, p.lse = view(out), view(lse)
    ws = workspace(_workspace_size(lib.fdma_attention_workspace_size, p, _abi.PASS_FORWARD, "attention"), q.device)
    p.workspace, p.workspace_bytes = ws.data_ptr(), ws.numel()
    check(lib.fdma_attention_fwd(ctypes.byref(p)), "attention")
    return out, lse


@attention_fwd.register_fake
def _(q, k, v, mask, bias, causal, scale, softcap, deterministic):
    B, Sq, H, _ = q.shape
    return q.new_empty(q.shape), q.new_empty((B, H, Sq), dtype=torch.float32 if q.dtype != torch.float64 else q.dtype)


@torch.library.custom_op("flash_dma::attention_bwd", mutates_args=())
def attention_bwd(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor], bias: Optional[Tensor],
                  out: Tensor, lse: Tensor, causal: bool, scale: float, softcap: float, deterministic: bool,
                  want_dbias: bool) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    lib = library()
    dq, dk, dv = _grad_like(q), _grad_like(k), _grad_like(v)
    dbias = _grad_like(bias) if (want_dbias and bias is not None) else q.new_empty(0)
    p = _attention_params(q, k, v, mask, bias, causal, scale, softcap, deterministic)
    p.out, p.lse, p.dout = view(out), view(lse), view(dout)
    p.dq, p.dk, p.dv = view(dq), view(dk), view(dv)
    if dbias.numel():
        p.dbias = view(dbias)
    ws = workspace(_workspace_size(lib.fdma_attention_workspace_size, p, _abi.PASS_BACKWARD, "attention backward"),
                   q.device)
    p.workspace, p.workspace_bytes = ws.data_ptr(), ws.numel()
    check(lib.fdma_attention_bwd(ctypes.byref(p)), "attention backward")
    return dq, dk, dv, dbias


@attention_bwd.register_fake
def _(dout, q, k, v, mask, bias, out, lse, causal, scale, softcap, deterministic, want_dbias):
    dbias = bias.new_empty(bias.shape) if (want_dbias and bias is not None) else q.new_empty(0)
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), dbias


def _attention_setup(ctx, inputs, output):
    q, k, v, mask, bias, causal, scale, softcap, deterministic = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, mask, bias, out, lse)
    ctx.args = (causal, scale, softcap, deterministic)
    ctx.mark_non_differentiable(lse)


def _attention_backward(ctx, dout, _dlse):
    q, k, v, mask, bias, out, lse = ctx.saved_tensors
    causal, scale, softcap, deterministic = ctx.args
    want_dbias = bias is not None and ctx.needs_input_grad[4]
    if dout.stride(-1) != 1:
        dout = dout.contiguous()
    dq, dk, dv, dbias = torch.ops.flash_dma.attention_bwd(dout, q, k, v, mask, bias, out, lse, causal, scale, softcap,
                                                          deterministic, want_dbias)
    return dq, dk, dv, None, (dbias if want_dbias else None), None, None, None, None


torch.library.register_autograd("flash_dma::attention_fwd", _attention_backward, setup_context=_attention_setup)


# --- dynamic_mask_attention ----------------------------------------------------------------

def _dma_params(q, k, v, key_scores, key_padding, window, causal, add_scores, scale, softcap, deterministic):
    p = _abi.DmaParams()
    p.q, p.k, p.v, p.key_scores, p.key_padding = view(q), view(k), view(v), view(key_scores), view(key_padding)
    p.window, p.causal, p.add_scores = int(window), int(causal), int(add_scores)
    p.scale, p.softcap, p.deterministic = float(scale), float(softcap), int(deterministic)
    p.stream = stream_of(q)
    return p


@torch.library.custom_op("flash_dma::dma_fwd", mutates_args=())
def dma_fwd(q: Tensor, k: Tensor, v: Tensor, key_scores: Tensor, key_padding: Optional[Tensor], window: int,
            causal: bool, add_scores: bool, scale: float, softcap: float, deterministic: bool) -> Tuple[Tensor, Tensor]:
    lib = library()
    B, Sq, H, _ = q.shape
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty((B, H, Sq), dtype=torch.float32 if q.dtype != torch.float64 else torch.float64, device=q.device)
    p = _dma_params(q, k, v, key_scores, key_padding, window, causal, add_scores, scale, softcap, deterministic)
    p.out, p.lse = view(out), view(lse)
    ws = workspace(_workspace_size(lib.fdma_dma_workspace_size, p, _abi.PASS_FORWARD, "dynamic_mask_attention"),
                   q.device)
    p.workspace, p.workspace_bytes = ws.data_ptr(), ws.numel()
    check(lib.fdma_dma_fwd(ctypes.byref(p)), "dynamic_mask_attention")
    return out, lse


@dma_fwd.register_fake
def _(q, k, v, key_scores, key_padding, window, causal, add_scores, scale, softcap, deterministic):
    B, Sq, H, _ = q.shape
    return q.new_empty(q.shape), q.new_empty((B, H, Sq), dtype=torch.float32 if q.dtype != torch.float64 else q.dtype)


@torch.library.custom_op("flash_dma::dma_bwd", mutates_args=())
def dma_bwd(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, key_scores: Tensor, key_padding: Optional[Tensor],
            out: Tensor, lse: Tensor, window: int, causal: bool, add_scores: bool, scale: float, softcap: float,
            deterministic: bool) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    lib = library()
    dq, dk, dv, dscores = _grad_like(q), _grad_like(k), _grad_like(v), _grad_like(key_scores)
    p = _dma_params(q, k, v, key_scores, key_padding, window, causal, add_scores, scale, softcap, deterministic)
    p.out, p.lse, p.dout = view(out), view(lse), view(dout)
    p.dq, p.dk, p.dv, p.dkey_scores = view(dq), view(dk), view(dv), view(dscores)
    what = "dynamic_mask_attention backward"
    ws = workspace(_workspace_size(lib.fdma_dma_workspace_size, p, _abi.PASS_BACKWARD, what), q.device)
    p.workspace, p.workspace_bytes = ws.data_ptr(), ws.numel()
    check(lib.fdma_dma_bwd(ctypes.byref(p)), what)
    return dq, dk, dv, dscores


@dma_bwd.register_fake
def _(dout, q, k, v, key_scores, key_padding, out, lse, window, causal, add_scores, scale, softcap, deterministic):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), key_scores.new_empty(key_scores.shape)


def _dma_setup(ctx, inputs, output):
    q, k, v, key_scores, key_padding, window, causal, add_scores, scale, softcap, deterministic = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, key_scores, key_padding, out, lse)
    ctx.args = (window, causal, add_scores, scale, softcap, deterministic)
    ctx.mark_non_differentiable(lse)


def _dma_backward(ctx, dout, _dlse):
    q, k, v, key_scores, key_padding, out, lse = ctx.saved_tensors
    window, causal, add_scores, scale, softcap, deterministic = ctx.args
    if dout.stride(-1) != 1:
        dout = dout.contiguous()
    dq, dk, dv, dscores = torch.ops.flash_dma.dma_bwd(dout, q, k, v, key_scores, key_padding, out, lse, window, causal,
                                                      add_scores, scale, softcap, deterministic)
    return dq, dk, dv, (dscores if ctx.needs_input_grad[3] else None), None, None, None, None, None, None, None


torch.library.register_autograd("flash_dma::dma_fwd", _dma_backward, setup_context=_dma_setup)


# --- select --------------------------------------------------------------------------------

@torch.library.custom_op("flash_dma::select", mutates_args=())
def select(key_scores: Tensor, key_padding: Optional[Tensor], num_queries: int, window: int,
           causal: bool) -> Tuple[Tensor, Tensor]:
    lib = library()
    begin = torch.empty(key_scores.shape, dtype=torch.int32, device=key_scores.device)
    end = torch.empty_like(begin)
    p = _abi.SelectParams()
    p.key_scores, p.key_padding = view(key_scores), view(key_padding)
    p.num_queries, p.window, p.causal = int(num_queries), int(window), int(causal)
    p.keep_begin, p.keep_end = view(begin), view(end)
    p.stream = stream_of(key_scores)
    n = ctypes.c_size_t(0)
    check(lib.fdma_select_workspace_size(ctypes.byref(p), ctypes.byref(n)), "select_keys")
    ws = workspace(n.value, key_scores.device)
    p.workspace, p.workspace_bytes = ws.data_ptr(), ws.numel()
    check(lib.fdma_select(ctypes.byref(p)), "select_keys")
    return begin, end


@select.register_fake
def _(key_scores, key_padding, num_queries, window, causal):
    return (key_scores.new_empty(key_scores.shape, dtype=torch.int32),
            key_scores.new_empty(key_scores.shape, dtype=torch.int32))
