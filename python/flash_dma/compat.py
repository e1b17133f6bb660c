"""Migration shim with the original flash-dmattn signatures: existing code moves over by
changing one import (`from flash_dma import flash_dmattn_func, flash_dmattn_varlen_func`)."""
from ._api import attention, attention_varlen


def flash_dmattn_func(query, key, value, attn_mask=None, attn_bias=None, softmax_scale=None, is_causal=None,
                      softcap=None, deterministic=None, return_attn_probs=None):
    """query [B, Sq, H, D], key/value [B, Sk, Hk, D]; attn_mask (bool, True keeps) and attn_bias
    broadcastable to [B, H, Sq, Sk]. Returns the output; with return_attn_probs, (out, lse)
    (the probabilities themselves are never materialised)."""
    out = attention(query, key, value, attn_mask=attn_mask, attn_bias=attn_bias, is_causal=bool(is_causal),
                    softmax_scale=softmax_scale, softcap=softcap or 0.0, deterministic=bool(deterministic),
                    return_lse=bool(return_attn_probs))
    return out


def flash_dmattn_varlen_func(query, key, value, attn_mask=None, attn_bias=None, cu_seqlens_q=None, cu_seqlens_k=None,
                             max_seqlen_q=None, max_seqlen_k=None, softmax_scale=None, is_causal=None, softcap=None,
                             deterministic=None, return_attn_probs=None):
    """Packed batches: query [total_q, H, D], key/value [total_k, Hk, D], cu_seqlens int32
    [num_seqs + 1] (flash_dma.attention_varlen). attn_mask and attn_bias are per key here
    ([total_k] or [1|Hk|H, total_k]): a packed batch has no [B, H, Sq, Sk] layout. A 4-D query
    is a padded batch and goes to flash_dmattn_func."""
    if query.dim() == 4:
        return flash_dmattn_func(query, key, value, attn_mask, attn_bias, softmax_scale, is_causal, softcap,
                                 deterministic, return_attn_probs)
    for t, name in ((attn_mask, "attn_mask"), (attn_bias, "attn_bias")):
        if t is not None and t.dim() > 2:
            raise ValueError(f"flash_dmattn_varlen_func: {name} must be per key ([total_k] or [heads, total_k]) for a "
                             f"packed batch, got shape {tuple(t.shape)}")
    if cu_seqlens_q is None or cu_seqlens_k is None or max_seqlen_q is None or max_seqlen_k is None:
        raise ValueError("flash_dmattn_varlen_func: a packed query needs cu_seqlens_q, cu_seqlens_k, max_seqlen_q and "
                         "max_seqlen_k")
    return attention_varlen(query, key, value, cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q), int(max_seqlen_k),
                            key_bias=attn_bias, key_mask=attn_mask, is_causal=bool(is_causal),
                            softmax_scale=softmax_scale, softcap=softcap or 0.0, deterministic=bool(deterministic),
                            return_lse=bool(return_attn_probs))
