"""Property tests (hypothesis): random shapes, heads, broadcast patterns of mask and bias,
dtypes, windows, causal flags, key padding and tied scores, each checked against the float64
references this test suite writes (reference.py: dense masked attention and brute-force top-w,
not the library's CPU backend), values and every gradient by autograd on the reference; and
generation loops against KV caches (paged or not, with or without a select_state), step by step.

The CPU backend by default (float32 and float64); `--device cuda` runs them on the GPU
(bfloat16, float16). The hypothesis profile in conftest.py: 30 fixed examples a test, or
`--hypothesis-profile=thorough` for 1000 fresh ones.
"""
import pytest
import torch

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import flash_dma
from reference import attention_ref, select_ref

TOL = {torch.float64: 1e-9, torch.float32: 3e-4, torch.bfloat16: 4e-2, torch.float16: 6e-3}


def dtypes(device):
    return [torch.float64, torch.float32] if device.type == "cpu" else [torch.bfloat16, torch.float16]


def close(actual, expected, dtype, what):
    """Within the tolerance of the computation's dtype or of the result's, the looser."""
    if expected.numel() == 0:
        return
    tol = max(TOL[dtype], TOL[actual.dtype]) * max(1.0, expected.abs().max().item())
    err = (actual.double() - expected.double()).abs().max().item()
    assert err <= tol, f"{what}: max |err| {err:.3g} > {tol:.3g}"


def close_with_grads(out, ref, leaves, refs, make, dtype):
    """out against ref, then every leaf's gradient against its float64 twin's, for one random dout."""
    close(out, ref, dtype, "out")
    dout = make(*out.shape)
    got = torch.autograd.grad(out, leaves, dout)
    want = torch.autograd.grad(ref, refs, dout.double())
    for name, g, w in zip(["dq", "dk", "dv", "dbias"], got, want):
        close(g, w, dtype, name)


@st.composite
def shapes(draw):
    Hk = draw(st.integers(1, 3))
    return dict(B=draw(st.integers(1, 2)), Sq=draw(st.integers(1, 40)), Sk=draw(st.integers(1, 40)), Hk=Hk,
                H=Hk * draw(st.integers(1, 3)), D=draw(st.sampled_from([8, 16, 24, 32, 64])))


def broadcast_shape(draw, s, heads_allowed):
    """A [B|1, heads, Sq|1, Sk|1] shape."""
    return (draw(st.sampled_from([1, s["B"]])), draw(st.sampled_from(heads_allowed)), draw(st.sampled_from([1, s["Sq"]])),
            draw(st.sampled_from([1, s["Sk"]])))


def tensors(s, dtype, device, gen):
    def make(*shape, lo=-1.0, hi=1.0):
        return (torch.rand(shape, generator=gen, dtype=torch.float64) * (hi - lo) + lo).to(device, dtype)
    return (make(s["B"], s["Sq"], s["H"], s["D"]), make(s["B"], s["Sk"], s["Hk"], s["D"]),
            make(s["B"], s["Sk"], s["Hk"], s["D"]), make)


@given(data=st.data())
def test_attention_against_the_reference(device, data):
    s = data.draw(shapes())
    dtype = data.draw(st.sampled_from(dtypes(device)))
    causal = data.draw(st.booleans())
    softcap = data.draw(st.sampled_from([0.0, 0.0, 5.0]))
    gen = torch.Generator().manual_seed(data.draw(st.integers(0, 2 ** 31)))
    q, k, v, make = tensors(s, dtype, device, gen)
    heads = sorted({1, s["Hk"], s["H"]})
    mask = bias = None
    if data.draw(st.booleans()):
        mask = make(*broadcast_shape(data.draw, s, heads), lo=0.0, hi=1.0) > 0.3
    if data.draw(st.booleans()):
        bias_dtype = data.draw(st.sampled_from([dtype, torch.float32]))
        bias = make(*broadcast_shape(data.draw, s, heads)).to(bias_dtype)
    leaves = [t.requires_grad_() for t in (q, k, v) + ((bias,) if bias is not None else ())]
    out = flash_dma.attention(q, k, v, attn_mask=mask, attn_bias=bias, is_causal=causal, softcap=softcap)
    refs = [t.detach().double().requires_grad_() for t in leaves]  # float64 leaves of the reference
    ref = attention_ref(*refs[:3], mask=mask, bias=refs[3] if bias is not None else None, causal=causal,
                        softcap=softcap)
    close_with_grads(out, ref, leaves, refs, make, dtype)


@given(data=st.data())
def test_dynamic_mask_attention_against_the_reference(device, data):
    s = data.draw(shapes())
    dtype = data.draw(st.sampled_from(dtypes(device)))
    causal = data.draw(st.booleans())
    add_scores = data.draw(st.booleans())
    window = data.draw(st.integers(1, s["Sk"] + 3))
    gen = torch.Generator().manual_seed(data.draw(st.integers(0, 2 ** 31)))
    q, k, v, make = tensors(s, dtype, device, gen)
    scores = make(s["B"], s["Hk"], s["Sk"], lo=-2.0, hi=2.0).float()
    if data.draw(st.booleans()):  # ties: a few distinct values
        scores = (scores * 2).round() / 2
    padding = None
    if data.draw(st.booleans()):
        padding = make(s["B"], s["Sk"], lo=0.0, hi=1.0) > 0.25
    leaves = [t.requires_grad_() for t in (q, k, v, scores)]
    out = flash_dma.dynamic_mask_attention(q, k, v, scores, window, is_causal=causal, key_padding_mask=padding,
                                           add_scores=add_scores)
    keep = select_ref(scores.detach(), window, s["Sq"], causal, padding)  # [B, Hk, Sq, Sk]
    refs = [t.detach().double().requires_grad_() for t in leaves]
    bias = refs[3].unsqueeze(2) if add_scores else None  # [B, Hk, 1, Sk]
    ref = attention_ref(*refs[:3], mask=keep, bias=bias)
    close(out, ref, dtype, "out")
    dout = make(*out.shape)
    got = torch.autograd.grad(out, leaves, dout, allow_unused=True)
    want = torch.autograd.grad(ref, refs, dout.double(), allow_unused=True)
    for name, g, w in zip(["dq", "dk", "dv", "dkey_scores"], got, want):
        w = torch.zeros_like(refs[3]) if w is None else w  # scores not added: zero gradient
        g = torch.zeros_like(w) if g is None else g
        close(g, w, dtype, name)


@given(data=st.data())
def test_attention_varlen_against_the_reference(device, data):
    """Packed batches: the reference sees the whole packed row with a block-diagonal keep-mask
    (each query its own sequence's keys, bottom-right causal per sequence), never split."""
    Hk = data.draw(st.integers(1, 3))
    H, D = Hk * data.draw(st.integers(1, 3)), data.draw(st.sampled_from([8, 16, 32, 64]))
    n = data.draw(st.integers(0, 5))
    q_lens = data.draw(st.lists(st.integers(0, 30), min_size=n, max_size=n))
    k_lens = data.draw(st.lists(st.integers(0, 30), min_size=n, max_size=n))
    tq, tk = sum(q_lens), sum(k_lens)
    dtype = data.draw(st.sampled_from(dtypes(device)))
    causal = data.draw(st.booleans())
    softcap = data.draw(st.sampled_from([0.0, 0.0, 5.0]))
    gen = torch.Generator().manual_seed(data.draw(st.integers(0, 2 ** 31)))

    def make(*shape, lo=-1.0, hi=1.0):
        return (torch.rand(shape, generator=gen, dtype=torch.float64) * (hi - lo) + lo).to(device, dtype)

    q, k, v = make(tq, H, D), make(tk, Hk, D), make(tk, Hk, D)
    # The GPU holds one bias and mask per KV head: [H, total_k] only where H == Hk there.
    heads = sorted({1, Hk} | ({H} if device.type == "cpu" or H == Hk else set()))
    mask = bias = None
    if data.draw(st.booleans()):
        mask = make(data.draw(st.sampled_from(heads)), tk, lo=0.0, hi=1.0) > 0.3
    if data.draw(st.booleans()):
        bias = make(data.draw(st.sampled_from(heads)), tk).to(data.draw(st.sampled_from([dtype, torch.float32])))

    def cu(lens):
        return torch.tensor([0] + torch.tensor(lens, dtype=torch.int64).cumsum(0).tolist(), dtype=torch.int32,
                            device=device)

    leaves = [t.requires_grad_() for t in (q, k, v) + ((bias,) if bias is not None else ())]
    out = flash_dma.attention_varlen(q, k, v, cu(q_lens), cu(k_lens), max(q_lens, default=0),
                                     max(k_lens, default=0), key_bias=bias, key_mask=mask, is_causal=causal,
                                     softcap=softcap)
    keep = torch.zeros(tq, tk, dtype=torch.bool, device=device)
    q0 = k0 = 0
    for nq, nk in zip(q_lens, k_lens):
        i = torch.arange(nq, device=device).view(-1, 1)
        j = torch.arange(nk, device=device).view(1, -1)
        keep[q0:q0 + nq, k0:k0 + nk] = (j <= i + nk - nq) if causal else True
        q0, k0 = q0 + nq, k0 + nk
    keep = keep.view(1, 1, tq, tk)
    if mask is not None:
        keep = keep & mask.view(1, mask.shape[0], 1, tk)
    refs = [t.detach().double().requires_grad_() for t in leaves]
    ref_bias = refs[3].view(1, bias.shape[0], 1, tk) if bias is not None else None
    ref = attention_ref(refs[0][None], refs[1][None], refs[2][None], mask=keep, bias=ref_bias, softcap=softcap)[0]
    close_with_grads(out, ref, leaves, refs, make, dtype)


@given(data=st.data())
def test_select_keys_against_brute_force(device, data):
    B, Hk, Sk = data.draw(st.integers(1, 2)), data.draw(st.integers(1, 3)), data.draw(st.integers(1, 60))
    Sq = data.draw(st.integers(1, 60))
    window, causal = data.draw(st.integers(1, Sk + 2)), data.draw(st.booleans())
    gen = torch.Generator().manual_seed(data.draw(st.integers(0, 2 ** 31)))
    scores = (torch.rand(B, Hk, Sk, generator=gen) * 4 - 2)
    if data.draw(st.booleans()):
        scores = scores.round()
    scores = scores.to(device, data.draw(st.sampled_from([torch.float32, torch.bfloat16, torch.float16])))
    padding = (torch.rand(B, Sk, generator=gen) > 0.3).to(device) if data.draw(st.booleans()) else None
    sel = flash_dma.select_keys(scores, window, num_queries=Sq, is_causal=causal, key_padding_mask=padding)
    i = torch.arange(Sq, device=device).view(1, 1, -1, 1)
    got = (i >= sel.begin.unsqueeze(2)) & (i < sel.end.unsqueeze(2))
    assert torch.equal(got, select_ref(scores.float(), window, Sq, causal, padding))


def logical_cache(kp, vp, sp, table, max_len):
    """A paged cache's content per sequence: [B, max_len, Hk, D] twice and [B, Hk, max_len]."""
    B, pages = table.shape
    idx = table.long()
    k = kp[idx].reshape(B, pages * kp.shape[1], *kp.shape[2:])[:, :max_len]
    v = vp[idx].reshape(B, pages * vp.shape[1], *vp.shape[2:])[:, :max_len]
    s = sp[idx].reshape(B, pages * sp.shape[1], sp.shape[2]).transpose(1, 2)[:, :, :max_len]
    return k, v, s


@given(data=st.data())
def test_kvcache_decode_loop_against_the_reference(device, data):
    """A few steps of a generation loop through dynamic_mask_attention_with_kvcache (or the dense
    attention_with_kvcache), each appending Sq tokens (1..16: decode and speculative steps),
    with or without a select_state, over ragged lengths from 0 to past the window, contiguous or
    shuffled pages, GQA, causal or not, scores added or not, tied scores, softcap: every step's
    output against the float64 reference on each sequence's keys, the appended ones included."""
    Hk = data.draw(st.integers(1, 2))
    B, H, D = data.draw(st.integers(1, 3)), Hk * data.draw(st.integers(1, 4)), data.draw(st.sampled_from([32, 64]))
    Sq, steps = data.draw(st.integers(1, 16)), data.draw(st.integers(1, 3))
    page = data.draw(st.sampled_from([0, 16, 32]))
    max_len = data.draw(st.integers(steps * Sq, steps * Sq + 80))
    lens = [data.draw(st.integers(0, max_len - steps * Sq)) for _ in range(B)]
    window = data.draw(st.integers(1, max_len + 2))
    dynamic, causal, add_scores = data.draw(st.booleans()), data.draw(st.booleans()), data.draw(st.booleans())
    with_state, ties = dynamic and data.draw(st.booleans()), data.draw(st.booleans())
    softcap = data.draw(st.sampled_from([0.0, 0.0, 3.0]))
    dtype = torch.float32 if device.type == "cpu" else data.draw(st.sampled_from([torch.bfloat16, torch.float16]))
    gen = torch.Generator().manual_seed(data.draw(st.integers(0, 2 ** 31)))

    def make(*shape, lo=-1.0, hi=1.0, dt=dtype):
        return (torch.rand(shape, generator=gen, dtype=torch.float64) * (hi - lo) + lo).to(device, dt)

    def scores(*shape):
        s = make(*shape, lo=-2.0, hi=2.0, dt=torch.float32)
        return (s * 2).round() / 2 if ties else s

    if page:
        pages = (max_len + page - 1) // page
        n = B * pages + 1  # one page no sequence owns
        table = torch.randperm(n, generator=gen)[: B * pages].to(torch.int32).view(B, pages).to(device)
        cache = dict(k_cache=make(n, page, Hk, D), v_cache=make(n, page, Hk, D), score_cache=scores(n, page, Hk),
                     block_table=table)
    else:
        cache = dict(k_cache=make(B, max_len, Hk, D), v_cache=make(B, max_len, Hk, D), score_cache=scores(B, Hk, max_len))
    state = flash_dma.new_select_state(cache["k_cache"], window, cache.get("block_table")) if with_state else None
    seqlens = torch.tensor(lens, dtype=torch.int32, device=device)
    for t in range(steps):
        q, kn, vn, sn = make(B, Sq, H, D), make(B, Sq, Hk, D), make(B, Sq, Hk, D), scores(B, Hk, Sq)
        if dynamic:
            out = flash_dma.dynamic_mask_attention_with_kvcache(q, cache_seqlens=seqlens, window_size=window, k=kn,
                                                                v=vn, scores=sn, is_causal=causal,
                                                                add_scores=add_scores, softcap=softcap,
                                                                select_state=state, **cache)
        else:
            dense_cache = {name: x for name, x in cache.items() if name != "score_cache"}
            out = flash_dma.attention_with_kvcache(q, cache_seqlens=seqlens, k=kn, v=vn, is_causal=causal,
                                                   softcap=softcap, **dense_cache)
        if page:
            k, v, s = logical_cache(cache["k_cache"], cache["v_cache"], cache["score_cache"], table, max_len)
        else:
            k, v, s = cache["k_cache"], cache["v_cache"], cache["score_cache"]
        for b in range(B):
            L = lens[b] + Sq
            sb = s[b:b + 1, :, :L]
            keep = select_ref(sb, window if dynamic else L, Sq, causal)
            bias = sb.double().unsqueeze(2) if dynamic and add_scores else None
            ref = attention_ref(q[b:b + 1].double(), k[b:b + 1, :L].double(), v[b:b + 1, :L].double(), mask=keep,
                                bias=bias, softcap=softcap)
            close(out[b:b + 1], ref, dtype, f"out, step {t}, sequence {b}")
        seqlens += Sq
        lens = [x + Sq for x in lens]
