"""Context parallelism: attention over a sequence sharded across the ranks of a
torch.distributed process group (NCCL on GPUs, gloo on the CPU backend).

Each rank holds one contiguous shard of the sequence, in group-rank order: its queries, keys,
values and key scores (shards may differ in length, empty ones included). The result on each
rank is its shard of what one process computes over the whole sequence, forward and backward:
dq for its queries, and dk, dv, dkey_scores (dbias) summed over the ranks whose queries use
each key and returned to the rank that holds it.

How: the keys' side (K, V, scores, padding) is all-gathered, each rank runs the single-GPU
kernel on its queries against the keys before and within its shard (bottom-right causal
alignment puts its queries at their global positions), and the keys' gradients are
reduce-scattered (summed in float32, or in the gradients' own dtype between two ranks,
where each sum is a single addition rounded once). With GQA the keys' side is a fraction of the queries' (Hk / H of
the bytes), and a top-w query costs the same wherever it sits, so contiguous shards balance
without a zigzag layout. Memory: the query side is O(N / P) per rank, the gathered keys O(N).

Every call first all-gathers a small description of each rank's arguments, and raises the
same error on every rank where they disagree (or where one rank's arguments are invalid), so
that a bad call never leaves a collective waiting.
"""
import struct

import torch
import torch.distributed as dist

from ._api import attention as _attention
from ._api import dynamic_mask_attention as _dynamic_mask_attention

_DTYPES = {torch.float32: 1, torch.float16: 2, torch.bfloat16: 3, torch.float64: 4}


def _float_bits(x):
    return struct.unpack("<q", struct.pack("<d", float(x)))[0]


def _check_ranks(what, group, device, length, shapes, scalars, local_error):
    """All-gathers every rank's argument record (its shard length, the arguments' shapes with
    the sequence dim zeroed, the scalars); returns the shard lengths, or raises the same
    ValueError on every rank."""
    rec = [1 if local_error else 0, length]
    for shape in shapes:
        shape = list(shape) if shape is not None else []
        rec += [len(shape)] + shape + [0] * (4 - len(shape))
    rec += list(scalars)
    mine = torch.tensor(rec, dtype=torch.int64, device=device)
    size = dist.get_world_size(group)
    everyone = torch.empty(size * len(rec), dtype=torch.int64, device=device)
    dist.all_gather_into_tensor(everyone, mine, group=group)
    rows = everyone.view(size, len(rec)).cpu().tolist()
    bad = [r for r, row in enumerate(rows) if row[0]]
    if bad:
        raise ValueError(f"{what}: the arguments of rank(s) {bad} of the group are invalid"
                         + (f": {local_error}" if local_error else " (see the error raised there)"))
    for r, row in enumerate(rows):
        if row[2:] != rows[0][2:]:
            raise ValueError(f"{what}: rank {r} of the group was called with other shapes, dtypes or arguments "
                             f"than rank 0 (only the shards' sequence lengths may differ): every rank must pass "
                             f"the same batch, heads, head dim, dtypes, window and flags")
    return [row[1] for row in rows]


def _gather_start(x, dim, lengths, group):
    """Starts the all-gather of the ranks' shards of x along dim (padded to the longest for the
    collective); the returned function waits for it and gives their concatenation."""
    size, longest = len(lengths), max(lengths)
    if longest == 0:  # every shard empty: nothing to exchange
        return lambda: x
    x = x.movedim(dim, 0)
    if x.shape[0] < longest:
        x = torch.cat([x, x.new_zeros((longest - x.shape[0],) + tuple(x.shape[1:]))])
    out = x.new_empty((size * longest,) + tuple(x.shape[1:]))
    work = dist.all_gather_into_tensor(out, x.contiguous(), group=group, async_op=True)

    def finish():
        work.wait()
        if all(n == longest for n in lengths):  # equal shards: no padding to cut out
            return out.movedim(0, dim)
        return torch.cat([out[r * longest: r * longest + n] for r, n in enumerate(lengths)]).movedim(0, dim)
    return finish


def _sum_dtype(dtype, size):
    """The dtype the gradients are summed in. Two ranks: each sum is a single addition of two
    values, rounded once to their dtype: the same bits as their float32 sum rounded back (which
    is exact, or off by less than half a bf16/fp16 step), so half-precision gradients travel as they are:
    half the bytes, no conversion. More ranks: float32, so that the collective's partial sums
    are not rounded to half precision at every step."""
    return dtype if size <= 2 or dtype in (torch.float32, torch.float64) else torch.float32


def _scatter_start(g, dim, lengths, rank, group):
    """Starts the reduce-scatter of g, the whole sequence along dim; the returned function
    waits for it and gives this rank's shard of the sum over ranks (in _sum_dtype)."""
    size, longest = len(lengths), max(lengths)
    dtype = _sum_dtype(g.dtype, size)
    if longest == 0:
        return lambda: g.to(dtype)
    g = g.movedim(dim, 0)
    if all(n == longest for n in lengths):  # equal shards: the whole tensor is the layout
        padded = g.to(dtype).contiguous()
    else:
        padded = g.new_zeros((size * longest,) + tuple(g.shape[1:]), dtype=dtype)
        start = 0
        for r, n in enumerate(lengths):
            padded[r * longest: r * longest + n] = g[start: start + n]
            start += n
    mine = padded.new_empty((longest,) + tuple(g.shape[1:]))
    work = dist.reduce_scatter_tensor(mine, padded, group=group, async_op=True)

    def finish():
        work.wait()
        return mine[: lengths[rank]].movedim(0, dim)
    return finish


def _gather_seq(x, dim, lengths, group):
    return _gather_start(x, dim, lengths, group)()


def _scatter_seq_sum(g, dim, lengths, rank, group):
    return _scatter_start(g, dim, lengths, rank, group)()


class _GatherKeys(torch.autograd.Function):
    """The keys' side (K, V, scores or bias, padding) all-gathered along the sequence, every
    collective in flight at once; backward reduce-scatters the gradients the same way."""

    @staticmethod
    def forward(ctx, dims, lengths, rank, group, *xs):
        ctx.dims, ctx.lengths, ctx.rank, ctx.group = dims, lengths, rank, group
        ctx.dtypes = [x.dtype for x in xs]
        finishes = [_gather_start(x, d, lengths, group) for x, d in zip(xs, dims)]
        outs = tuple(f() for f in finishes)
        ctx.mark_non_differentiable(*(o for o in outs if not o.is_floating_point()))
        return outs

    @staticmethod
    def backward(ctx, *grads):
        finishes = [None if g is None or not ctx.needs_input_grad[4 + i] else
                    _scatter_start(g, ctx.dims[i], ctx.lengths, ctx.rank, ctx.group) for i, g in enumerate(grads)]
        return (None, None, None, None) + tuple(None if f is None else f().to(dt)
                                                for f, dt in zip(finishes, ctx.dtypes))


def _gather_keys(pairs, lengths, rank, group):
    """[(tensor or None, dim)] -> the gathered tensors (None stays None)."""
    present = [(x, d) for x, d in pairs if x is not None]
    outs = iter(_GatherKeys.apply(tuple(d for _, d in present), lengths, rank, group, *(x for x, _ in present)))
    return [None if x is None else next(outs) for x, _ in pairs]


def _group_rank(what, group):
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(f"{what}: torch.distributed is not initialized (call init_process_group first)")
    rank = dist.get_rank(group)
    if rank < 0:
        raise ValueError(f"{what}: this process is not a member of the given process group")
    return rank


def _shape_error(what, q, k, v, extra):
    """A local argument problem as text (None if the arguments are fine), so that it can be
    announced to every rank instead of raising before the collective."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            return f"{name} must be a 4-d tensor [B, S, heads, D]"
    if k.shape != v.shape:
        return f"k {tuple(k.shape)} and v {tuple(v.shape)} must have the same shape"
    if q.shape[1] != k.shape[1]:
        return (f"a rank's shard holds as many queries as keys: q has {q.shape[1]}, k {k.shape[1]} "
                f"(shard the sequence, not the queries alone)")
    if q.shape[0] != k.shape[0] or q.shape[3] != k.shape[3] or q.shape[2] % max(k.shape[2], 1):
        return f"q {tuple(q.shape)} and k {tuple(k.shape)} do not match (batch, head dim, or H % Hk)"
    if q.dtype != k.dtype or k.dtype != v.dtype:
        return "q, k and v must have one dtype"
    if q.device != k.device or k.device != v.device:
        return "q, k and v must be on one device"
    return extra


def dynamic_mask_attention(q, k, v, key_scores, window_size, group=None, is_causal=True, softmax_scale=None,
                           softcap=0.0, key_padding_mask=None, add_scores=True, deterministic=False,
                           return_lse=False):
    """flash_dma.dynamic_mask_attention over a sequence sharded across `group` (default: the
    world). On each rank: q [B, n, H, D], k, v [B, n, Hk, D], key_scores [B, Hk, n] and
    key_padding_mask [B, n] are its contiguous shard of the sequence (n may differ per rank;
    shards follow group-rank order). Returns this rank's shard of the output (and of lse
    [B, H, n] when return_lse), differentiable as the single-process call is: dq here, dk, dv
    and dkey_scores summed over the ranks and returned to the shard's owner."""
    what = "flash_dma.distributed.dynamic_mask_attention"
    rank = _group_rank(what, group)
    extra = None
    if not isinstance(key_scores, torch.Tensor) or key_scores.dim() != 3:
        extra = "key_scores must be a [B, Hk, n] tensor"
    elif isinstance(window_size, bool) or not isinstance(window_size, int) or window_size < 1:
        extra = f"window_size must be an integer >= 1, got {window_size!r}"
    elif key_padding_mask is not None and (key_padding_mask.dim() != 2 or key_padding_mask.dtype != torch.bool):
        extra = "key_padding_mask must be a torch.bool [B, n] tensor"
    err = _shape_error(what, q, k, v, extra)
    if err is None and (key_scores.shape[0] != k.shape[0] or key_scores.shape[1] != k.shape[2]
                        or key_scores.shape[2] != k.shape[1]):
        err = f"key_scores {tuple(key_scores.shape)} must be [B, Hk, n] = {(k.shape[0], k.shape[2], k.shape[1])}"
    if err is None and key_padding_mask is not None and tuple(key_padding_mask.shape) != (k.shape[0], k.shape[1]):
        err = f"key_padding_mask {tuple(key_padding_mask.shape)} must be [B, n] = {(k.shape[0], k.shape[1])}"
    ok = err is None
    shapes = [_zero(q.shape, 1) if ok else None, _zero(k.shape, 1) if ok else None, _zero(v.shape, 1) if ok else None,
              _zero(key_scores.shape, 2) if ok else None,
              _zero(key_padding_mask.shape, 1) if ok and key_padding_mask is not None else None]
    scalars = [int(window_size) if isinstance(window_size, int) else -1, int(bool(is_causal)), int(bool(add_scores)),
               int(bool(deterministic)), _float_bits(softmax_scale or 0.0), _float_bits(softcap or 0.0),
               _DTYPES.get(q.dtype, 0) if ok else 0, _DTYPES.get(key_scores.dtype, 0) if ok else 0,
               int(key_padding_mask is not None)]
    device = q.device if isinstance(q, torch.Tensor) else torch.device("cpu")
    lengths = _check_ranks(what, group, _collective_device(device, group), q.shape[1] if ok else 0, shapes,
                           scalars, err)
    end = sum(lengths[: rank + 1])
    upto = end if is_causal else sum(lengths)
    k_all, v_all, s_all, pad_all = _gather_keys([(k, 1), (v, 1), (key_scores, 2), (key_padding_mask, 1)], lengths,
                                                rank, group)
    k_all, v_all, s_all = k_all[:, :upto], v_all[:, :upto], s_all[:, :, :upto]
    if pad_all is not None:
        pad_all = pad_all[:, :upto]
    return _dynamic_mask_attention(q, k_all, v_all, s_all, window_size, is_causal=is_causal,
                                   softmax_scale=softmax_scale, softcap=softcap, key_padding_mask=pad_all,
                                   add_scores=add_scores, deterministic=deterministic, return_lse=return_lse)


def attention(q, k, v, key_bias=None, group=None, is_causal=False, softmax_scale=None, softcap=0.0,
              deterministic=False, return_lse=False):
    """flash_dma.attention over a sequence sharded across `group`, with an optional per-key
    additive bias key_bias [B, Hb, n] (Hb 1, Hk or H), the shard's part of a [B, Hb, 1, N] bias.
    Shards and gradients as in dynamic_mask_attention (dkey_bias summed over the ranks)."""
    what = "flash_dma.distributed.attention"
    rank = _group_rank(what, group)
    extra = None
    if key_bias is not None and (not isinstance(key_bias, torch.Tensor) or key_bias.dim() != 3):
        extra = "key_bias must be a [B, Hb, n] tensor"
    err = _shape_error(what, q, k, v, extra)
    if err is None and key_bias is not None and (key_bias.shape[2] != k.shape[1]
                                                 or key_bias.shape[0] not in (1, k.shape[0])
                                                 or key_bias.shape[1] not in (1, k.shape[2], q.shape[2])):
        err = f"key_bias {tuple(key_bias.shape)} must be [B or 1, 1 or Hk or H, n] with n = {k.shape[1]}"
    ok = err is None
    shapes = [_zero(q.shape, 1) if ok else None, _zero(k.shape, 1) if ok else None, _zero(v.shape, 1) if ok else None,
              _zero(key_bias.shape, 2) if ok and key_bias is not None else None]
    scalars = [int(bool(is_causal)), int(bool(deterministic)), _float_bits(softmax_scale or 0.0),
               _float_bits(softcap or 0.0), _DTYPES.get(q.dtype, 0) if ok else 0,
               _DTYPES.get(key_bias.dtype, 0) if ok and key_bias is not None else 0]
    device = q.device if isinstance(q, torch.Tensor) else torch.device("cpu")
    lengths = _check_ranks(what, group, _collective_device(device, group), q.shape[1] if ok else 0, shapes,
                           scalars, err)
    end = sum(lengths[: rank + 1])
    upto = end if is_causal else sum(lengths)
    k_all, v_all, bias = _gather_keys([(k, 1), (v, 1), (key_bias, 2)], lengths, rank, group)
    k_all, v_all = k_all[:, :upto], v_all[:, :upto]
    if bias is not None:
        bias = bias[:, :, :upto].unsqueeze(2)
    return _attention(q, k_all, v_all, attn_bias=bias, is_causal=is_causal, softmax_scale=softmax_scale,
                      softcap=softcap, deterministic=deterministic, return_lse=return_lse)


def _zero(shape, dim):
    shape = list(shape)
    shape[dim] = 0
    return shape


def _collective_device(device, group):
    """Where the argument record travels: the backend's device (NCCL needs CUDA tensors)."""
    backend = dist.get_backend(group)
    if backend == "nccl":
        return device if device.type == "cuda" else torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")
