"""Migration shim with the original flash-dmattn signature: existing code moves over by
changing one import (`from flash_dma import flash_dmattn_func`)."""
from ._api import attention


def flash_dmattn_func(query, key, value, attn_mask=None, attn_bias=None, softmax_scale=None, is_causal=None,
                      softcap=None, deterministic=None, return_attn_probs=None):
    """query [B, Sq, H, D], key/value [B, Sk, Hk, D]; attn_mask (bool, True keeps) and attn_bias
    broadcastable to [B, H, Sq, Sk]. Returns the output; with return_attn_probs, (out, lse)
    (the probabilities themselves are never materialised)."""
    out = attention(query, key, value, attn_mask=attn_mask, attn_bias=attn_bias, is_causal=bool(is_causal),
                    softmax_scale=softmax_scale, softcap=softcap or 0.0, deterministic=bool(deterministic),
                    return_lse=bool(return_attn_probs))
    return out
