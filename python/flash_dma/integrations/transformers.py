"""Hugging Face transformers: an attention implementation named "flash_dma", and the same
under the alias "fdma"; and `enable(model)`, which runs the Doge models' dynamic mask
attention through flash_dma in O(N) (doge.py beside this file).

    import flash_dma  # registers both when transformers is installed
    model = AutoModelForCausalLM.from_config(config, attn_implementation="fdma")

Why the alias: transformers 5 treats every implementation name containing "flash" as a
FlashAttention kernel to load at model construction, so `attn_implementation="flash_dma"`
fails there; switching an existing model (`model.config._attn_implementation = "flash_dma"`)
works, and so does "fdma" everywhere. The function accepts both mask conventions: the 4-D
mask of the sdpa path and the [B, Sk] padding mask of the flash-attention path.

Attention layers then run flash_dma.attention: GQA without repeating K/V, the model's
causal/padding mask as a boolean mask (or an additive float mask as a bias), softcap when the
model uses one. A padding-free batch (one row packing several sequences, with transformers'
cu_seq_lens_q/k and max_length_q/k keyword arguments and no 4-D mask) runs attention_varlen,
each sequence its own problem.
"""
import torch

from .._api import attention, attention_varlen
from .doge import DOGE_IMPLEMENTATION, enable  # noqa: F401  (public: flash_dma.integrations.transformers.enable)

NAMES = ("flash_dma", "fdma")


def flash_dma_attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None,
                                **kwargs):
    """transformers' attention-function signature: query [B, H, Sq, D], key/value [B, Hk, Sk, D];
    returns (output [B, Sq, H, D], None)."""
    if dropout:
        raise ValueError("flash_dma attention has no dropout; set the model's attention_dropout to 0")
    if kwargs.get("output_attentions"):
        raise ValueError("flash_dma attention never materialises attention weights; use attn_implementation='eager'")
    if is_causal is None:
        is_causal = getattr(module, "is_causal", True)
    q, k, v = (x.transpose(1, 2) for x in (query, key, value))
    cu_q, cu_k = kwargs.get("cu_seq_lens_q"), kwargs.get("cu_seq_lens_k")
    if cu_q is not None and cu_k is not None and q.shape[0] == 1 and (attention_mask is None or attention_mask.dim() == 2):
        out = attention_varlen(q[0], k[0], v[0], cu_q.to(torch.int32), cu_k.to(torch.int32),
                               int(kwargs.get("max_length_q") or q.shape[1]), int(kwargs.get("max_length_k") or k.shape[1]),
                               is_causal=bool(is_causal), softmax_scale=scaling, softcap=kwargs.get("softcap") or 0.0)
        return out.unsqueeze(0), None
    mask = bias = None
    if attention_mask is not None and attention_mask.dim() == 2:
        # flash-attention convention: [B, Sk] padding (nonzero keeps), causality from the module
        mask = attention_mask[:, : k.shape[1]].bool()[:, None, None, :]
        is_causal = bool(is_causal) and query.shape[2] > 1
    else:
        # sdpa convention: a 4-D mask already holds causality and padding
        is_causal = bool(is_causal) and attention_mask is None and query.shape[2] > 1
    if attention_mask is not None and attention_mask.dim() != 2:
        attention_mask = attention_mask[..., : k.shape[1]]
        if attention_mask.dtype == torch.bool:
            mask = attention_mask
        else:
            bias = attention_mask if attention_mask.dtype in (q.dtype, torch.float32) else attention_mask.float()
    out = attention(q, k, v, attn_mask=mask, attn_bias=bias, is_causal=is_causal, softmax_scale=scaling,
                    softcap=kwargs.get("softcap") or 0.0)
    return out, None


def register():
    """Registers "flash_dma" and "fdma" with transformers' AttentionInterface (and the boolean
    4-D mask with AttentionMaskInterface). Returns False when transformers is missing or too old."""
    try:
        from transformers import AttentionInterface
    except ImportError:
        return False
    for name in NAMES + (DOGE_IMPLEMENTATION,):
        AttentionInterface.register(name, flash_dma_attention_forward)
    try:
        from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask, sdpa_mask

        for name in NAMES:
            AttentionMaskInterface.register(name, sdpa_mask)
        # The Doge layers enable() switches take the [B, Sk] padding mask (or None), never a 4-D one.
        AttentionMaskInterface.register(DOGE_IMPLEMENTATION, flash_attention_mask)
    except ImportError:
        pass  # older transformers build 4-D masks for every implementation
    return True
