"""transformers' Doge models through flash_dma: `enable(model)`.

Doge's attention is this library's operation: per-key scores exp(A * softplus(dt_proj(v))),
each query keeping its causal top-`keep_window_size` keys, the kept scores added to the
attention scores. transformers computes it in O(N^2): the model builds a [B, 1, Sq, Sk] mask,
each layer expands the scores to [B, Hk, Sq, Sk], runs torch.topk per query and hands the
dense float mask to the attention function. enable(model) replaces each DogeAttention's
forward with one that calls flash_dma.dynamic_mask_attention on the [B, Hk, Sk] scores (and,
decoding from a cache without gradients, dynamic_mask_attention_with_kvcache), and switches
the model to a mask function that passes only the [B, Sk] padding mask: O(N) memory in
training, padded batches and generate().

    model = DogeForCausalLM(config)
    flash_dma.integrations.transformers.enable(model)

Padding-free training (several sequences packed in one row, as transformers'
DataCollatorWithFlattening builds it) runs dynamic_mask_attention_varlen, each sequence its
own problem: from the `cu_seq_lens_q/k` and `max_length_q/k` keyword arguments when the batch
carries them, else from `position_ids` that restart at 0 where a sequence starts.
"""
import types

import torch
import torch.nn.functional as F

from .._api import dynamic_mask_attention, dynamic_mask_attention_varlen, dynamic_mask_attention_with_kvcache

DOGE_IMPLEMENTATION = "fdma_dynamic"
DECODE_MAX_QUERIES = 16  # the KV-cache path's decode range


def _doge_attention_forward(self, hidden_states, position_embeddings, attention_mask=None, past_key_values=None,
                            cache=None, **kwargs):
    """DogeAttention.forward with the same projections, norms, rotary embedding and cache update,
    and the dynamic mask attention itself in flash_dma. transformers names the cache
    `past_key_values` up to 5.23 and `cache` from 5.24: either is taken."""
    if past_key_values is None:
        past_key_values = cache
    from transformers.models.doge.modeling_doge import apply_rotary_pos_emb

    if self.training and self.attention_dropout:
        raise ValueError("flash_dma attention has no dropout; set the model's attention_dropout to 0")
    input_shape = hidden_states.shape[:-1]
    hidden_shape = (*input_shape, -1, self.head_dim)
    q = self.q_norm(self.q_proj(hidden_states).view(hidden_shape)).transpose(1, 2)
    k = self.k_norm(self.k_proj(hidden_states).view(hidden_shape)).transpose(1, 2)
    v = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)
    cos, sin = position_embeddings
    q, k = apply_rotary_pos_emb(q, k, cos, sin)
    if past_key_values is not None:
        k, v = past_key_values.update(k, v, self.layer_idx)
    B, Hk, Sk, _ = k.shape
    # Per-key scores [B, Hk, Sk], as transformers computes them (from every cached value).
    dt = self.dt_proj(v.transpose(1, 2).reshape(B, Sk, -1))
    scores = torch.exp(self.A * F.softplus(dt)).transpose(-1, -2)

    padding = None
    if attention_mask is not None:
        if attention_mask.dim() != 2:
            raise ValueError("flash_dma's Doge attention takes the [batch, keys] padding mask; call "
                             "flash_dma.integrations.transformers.enable(model) to switch the model's mask too")
        padding = attention_mask[:, -Sk:].bool()
        if bool(padding.all()):
            padding = None
    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [B, S, heads, D] views
    # Packed rows attend within this call's own keys (a cache empty before it, as in training).
    packed = _packed_sequences(kwargs, B, q.shape[2], Sk, padding is None and q.shape[2] == Sk)
    if packed is not None:
        cu_q, cu_k, max_q, max_k = packed
        out = dynamic_mask_attention_varlen(qt[0], kt[0], vt[0], scores[0], cu_q, cu_k, max_q, max_k,
                                            int(self.keep_window_size), is_causal=True, softmax_scale=self.scaling)
    elif past_key_values is not None and q.shape[2] <= DECODE_MAX_QUERIES and not torch.is_grad_enabled():
        # Decode: the cache as it is ([B, Hk, Sk, D] seen as [B, Sk, Hk, D]). A padded key's
        # score -inf: ranked last, and weightless were it ever kept.
        if padding is not None:
            scores = scores.masked_fill(~padding[:, None, :], float("-inf"))
        out = dynamic_mask_attention_with_kvcache(qt, kt, vt, scores, None, int(self.keep_window_size),
                                                  softmax_scale=self.scaling)
    else:
        out = dynamic_mask_attention(qt, kt, vt, scores, int(self.keep_window_size), is_causal=True,
                                     softmax_scale=self.scaling, key_padding_mask=padding)
    out = out.reshape(*input_shape, -1).contiguous()
    return self.o_proj(out), None


def _packed_sequences(kwargs, B, Sq, Sk, possible):
    """(cu_seqlens_q, cu_seqlens_k, max_q, max_k) when one row packs several sequences, else None.
    transformers' padding-free batches carry cu_seq_lens_q/k and max_length_q/k; without them,
    position_ids restarting at 0 mark the sequences (finding them costs a host synchronization,
    which transformers' own flash-attention path pays too)."""
    if not possible or B != 1:
        return None
    cu_q, cu_k = kwargs.get("cu_seq_lens_q"), kwargs.get("cu_seq_lens_k")
    if cu_q is not None and cu_k is not None:
        return (cu_q.to(torch.int32), cu_k.to(torch.int32), int(kwargs.get("max_length_q") or Sq),
                int(kwargs.get("max_length_k") or Sk))
    pos = kwargs.get("position_ids")
    if pos is None or pos.dim() != 2 or tuple(pos.shape) != (1, Sq) or Sq != Sk:
        return None
    if _found[0] is pos:  # every layer of one forward gets the same position_ids: look once
        return _found[1]
    starts = torch.nonzero(pos[0] == 0).flatten()
    found = None
    if starts.numel() > 1 or (starts.numel() == 1 and int(starts[0]) != 0):
        if int(starts[0]) != 0:
            starts = torch.cat([starts.new_zeros(1), starts])
        cu = torch.cat([starts, starts.new_full((1,), Sq)]).to(torch.int32)
        longest = int((cu[1:] - cu[:-1]).max())
        found = (cu, cu, longest, longest)
    _found[0], _found[1] = pos, found
    return found


_found = [None, None]  # the last position_ids looked at, and what they held


def enable(model):
    """Runs every DogeAttention layer of `model` through flash_dma (in place) and switches the
    model's mask to the [B, Sk] padding mask. Returns the model."""
    from transformers.models.doge.modeling_doge import DogeAttention

    from .transformers import register

    register()
    layers = [m for m in model.modules() if isinstance(m, DogeAttention)]
    if not layers:
        raise ValueError("flash_dma.integrations.transformers.enable: the model has no DogeAttention layers")
    for m in layers:
        m.forward = types.MethodType(_doge_attention_forward, m)
    model.config._attn_implementation = DOGE_IMPLEMENTATION
    return model
