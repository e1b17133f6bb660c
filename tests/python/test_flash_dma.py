"""flash_dma against float64 PyTorch references: values and gradients over a
shape list (ragged lengths, Sq != Sk, MHA/GQA/MQA, causal, softcap, every broadcast of mask
and bias), the selection, the flash-dmattn shim, torch.library.opcheck, torch.compile with
fullgraph, CUDA graph replay (on CUDA), the nn module, and bad inputs.

Run on the CPU backend by default; `pytest tests/python --device cuda` on a GPU machine.
"""
import pytest
import torch

import flash_dma
from reference import attention_ref, select_ref

SHAPES = [  # B, Sq, Sk, H, Hk, D
    (1, 1, 1, 2, 2, 16), (2, 7, 7, 2, 1, 32), (1, 63, 65, 4, 2, 64), (2, 65, 64, 3, 3, 40), (1, 100, 129, 4, 1, 64),
    (1, 129, 63, 2, 2, 128),
]


def dtypes(device):
    return [torch.float64, torch.float32] if device.type == "cpu" else [torch.bfloat16, torch.float16]


def tol(dtype):
    return {torch.float64: 1e-9, torch.float32: 2e-4, torch.bfloat16: 3e-2, torch.float16: 5e-3}[dtype]


def rand(shape, dtype, device, seed, lo=-1.0, hi=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(shape, generator=g, dtype=torch.float64) * (hi - lo) + lo).to(device=device, dtype=dtype)


def qkv(B, Sq, Sk, H, Hk, D, dtype, device, seed):
    return [rand(s, dtype, device, seed + i).requires_grad_() for i, s in
            enumerate([(B, Sq, H, D), (B, Sk, Hk, D), (B, Sk, Hk, D)])]


def assert_close(actual, expected, dtype, what):
    scale = max(1.0, expected.abs().max().item())
    err = (actual.double() - expected.double()).abs().max().item() if expected.numel() else 0.0
    assert err <= tol(dtype) * scale, f"{what}: max |err| {err:.3g} > {tol(dtype) * scale:.3g}"


def grads_of(fn, inputs, dout):
    for t in inputs:
        t.grad = None
    out = fn()
    out.backward(dout)
    return out, [t.grad for t in inputs]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("causal", [False, True])
def test_attention_matches_float64(device, shape, causal):
    B, Sq, Sk, H, Hk, D = shape
    for dtype in dtypes(device):
        q, k, v = qkv(B, Sq, Sk, H, Hk, D, dtype, device, seed=hash(shape) % 1000)
        dout = rand((B, Sq, H, D), dtype, device, 7)
        out, g = grads_of(lambda: flash_dma.attention(q, k, v, is_causal=causal), [q, k, v], dout)
        ref_in = [t.detach().double().requires_grad_() for t in (q, k, v)]
        ref, gr = grads_of(lambda: attention_ref(*ref_in, causal=causal), ref_in, dout.double())
        assert_close(out, ref, dtype, "out")
        for a, r, n in zip(g, gr, "qkv"):
            assert_close(a, r, dtype, f"d{n}")


@pytest.mark.parametrize("heads", [0, 1, 2])
@pytest.mark.parametrize("bits", range(8))
def test_every_mask_and_bias_broadcast(device, heads, bits):
    B, Sq, Sk, H, Hk, D = 2, 33, 47, 4, 2, 32
    dtype = dtypes(device)[0]
    shape = [B if bits & 1 else 1, [1, Hk, H][heads], Sq if bits & 2 else 1, Sk if bits & 4 else 1]
    q, k, v = qkv(B, Sq, Sk, H, Hk, D, dtype, device, seed=bits * 3 + heads)
    g = torch.Generator().manual_seed(bits)
    mask = (torch.rand(shape, generator=g) < 0.8).to(device)
    bias = rand(shape, dtype, device, 99 + bits, -2, 2).requires_grad_()
    dout = rand((B, Sq, H, D), dtype, device, 5)
    out, grads = grads_of(lambda: flash_dma.attention(q, k, v, attn_mask=mask, attn_bias=bias, softcap=5.0,
                                                      is_causal=bool(bits & 2)), [q, k, v, bias], dout)
    ref_in = [t.detach().double().requires_grad_() for t in (q, k, v, bias)]
    ref, rgrads = grads_of(lambda: attention_ref(*ref_in[:3], mask=mask, bias=ref_in[3], softcap=5.0,
                                                 causal=bool(bits & 2)), ref_in, dout.double())
    assert_close(out, ref, dtype, "out")
    for a, r, n in zip(grads, rgrads, ["dq", "dk", "dv", "dbias"]):
        assert a.shape == r.shape, n
        assert_close(a, r, dtype, n)


@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("bias_shape", ["per head", "per KV head", "over batches", "shared"])
def test_query_bias_gradients_without_a_mask(device, D, bias_shape):
    # Biases with a query dim and no mask at head dims 64 and 128, which the warp-specialized
    # backward takes on Hopper: dbias written tile by tile where each dS is one element, summed
    # in fp32 over heads (GQA or shared) or batches otherwise. Keys a multiple of 8 (16-byte
    # rows for the copy engine), queries not a multiple of the kernel's 64-query steps.
    B, Sq, Sk, H, Hk = 2, 130, 192, 4, 2
    shape = {"per head": [B, H, Sq, Sk], "per KV head": [B, Hk, Sq, Sk], "over batches": [1, H, Sq, Sk],
             "shared": [1, 1, Sq, Sk]}[bias_shape]
    dtype = dtypes(device)[0]
    for causal in (False, True):
        q, k, v = qkv(B, Sq, Sk, H, Hk, D, dtype, device, seed=D + int(causal))
        bias = rand(shape, dtype, device, 31 + D, -2, 2).requires_grad_()
        dout = rand((B, Sq, H, D), dtype, device, 11)
        out, grads = grads_of(lambda: flash_dma.attention(q, k, v, attn_bias=bias, is_causal=causal),
                              [q, k, v, bias], dout)
        ref_in = [t.detach().double().requires_grad_() for t in (q, k, v, bias)]
        ref, rgrads = grads_of(lambda: attention_ref(*ref_in[:3], bias=ref_in[3], causal=causal), ref_in,
                               dout.double())
        assert_close(out, ref, dtype, "out")
        for a, r, n in zip(grads, rgrads, ["dq", "dk", "dv", "dbias"]):
            assert a.shape == r.shape, n
            assert_close(a, r, dtype, f"{n} (causal {causal})")


def test_left_padded_causal_mask_with_empty_rows(device):
    # What a padded batch in a model brings: a 4-D causal + padding mask in which the padded
    # queries see no key at all, GQA and a small head dim.
    B, S, H, Hk, D, pad = 2, 40, 4, 2, 16, 7
    dtype = dtypes(device)[0]
    q, k, v = qkv(B, S, S, H, Hk, D, dtype, device, seed=21)
    keep_key = torch.ones(B, S, dtype=torch.bool)
    keep_key[1, :pad] = False
    mask = (torch.ones(S, S, dtype=torch.bool).tril() & keep_key[:, None, None, :]).to(device)  # [B, 1, S, S]
    dout = rand((B, S, H, D), dtype, device, 22)
    out, grads = grads_of(lambda: flash_dma.attention(q, k, v, attn_mask=mask), [q, k, v], dout)
    ref_in = [t.detach().double().requires_grad_() for t in (q, k, v)]
    ref, rgrads = grads_of(lambda: attention_ref(*ref_in, mask=mask), ref_in, dout.double())
    assert_close(out, ref, dtype, "out")
    for a, r, n in zip(grads, rgrads, ["dq", "dk", "dv"]):
        assert_close(a, r, dtype, n)



def test_float_mask_sentinels_as_a_bias(device):
    # The same batch's mask as transformers' float masks write it, passed as a bias: 0 where a
    # key is kept, the dtype's lowest value where not. The padded queries' rows hold only
    # sentinels; where the sentinel absorbs the scores (bf16, float32) they get the mean of every value
    # row (as SDPA's math path gives), not NaN.
    B, S, H, Hk, D, pad = 2, 40, 4, 2, 64, 7
    for dtype in dtypes(device):
        q, k, v = (t.detach() for t in qkv(B, S, S, H, Hk, D, dtype, device, seed=23))
        keep_key = torch.ones(B, S, dtype=torch.bool)
        keep_key[1, :pad] = False
        keep = (torch.ones(S, S, dtype=torch.bool).tril() & keep_key[:, None, None, :]).to(device)
        bias = torch.zeros(B, 1, S, S, dtype=dtype, device=device).masked_fill(~keep, torch.finfo(dtype).min)
        out = flash_dma.attention(q, k, v, attn_bias=bias)
        assert torch.isfinite(out).all()
        assert_close(out, attention_ref(q, k, v, bias=bias), dtype, f"out ({dtype})")
        if torch.finfo(dtype).min > -1e30:
            continue  # fp16's lowest value (-65504) does not absorb the scores: the reference alone says the rows
        assert_close(out[1, :pad], v[1].double().mean(0, keepdim=True).repeat_interleave(H // Hk, 1).expand(pad, H, D),
                     dtype, f"the sentinel rows' mean ({dtype})")

@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("case", [(1, 40, 40, 4, 2, 32, 8), (2, 37, 70, 2, 1, 64, 1), (1, 70, 37, 4, 4, 16, 100),
                                  (2, 64, 64, 4, 1, 32, 17)])
def test_dynamic_mask_attention_matches_float64(device, causal, case):
    B, Sq, Sk, H, Hk, D, w = case
    for dtype in dtypes(device):
        q, k, v = qkv(B, Sq, Sk, H, Hk, D, dtype, device, seed=w)
        scores = rand((B, Hk, Sk), torch.float32, device, 11, -2, 2).requires_grad_()
        padding = (torch.rand(B, Sk, generator=torch.Generator().manual_seed(3)) < 0.85).to(device)
        dout = rand((B, Sq, H, D), dtype, device, 12)
        fn = lambda: flash_dma.dynamic_mask_attention(q, k, v, scores, w, is_causal=causal,  # noqa: E731
                                                      key_padding_mask=padding, softcap=4.0)
        out, grads = grads_of(fn, [q, k, v, scores], dout)
        keep = select_ref(scores.detach(), w, Sq, causal, padding)  # [B, Hk, Sq, Sk]
        ref_in = [t.detach().double().requires_grad_() for t in (q, k, v, scores)]
        ref_fn = lambda: attention_ref(*ref_in[:3], mask=keep, bias=ref_in[3].unsqueeze(2), softcap=4.0)  # noqa: E731
        ref, rgrads = grads_of(ref_fn, ref_in, dout.double())
        assert_close(out, ref, dtype, "out")
        for a, r, n in zip(grads, rgrads, ["dq", "dk", "dv", "dkey_scores"]):
            # float32 scores keep a float32 gradient, whatever q's precision
            assert_close(a, r, torch.float32 if (n == "dkey_scores" and dtype == torch.float64) else dtype, n)


def test_scores_not_added_have_zero_gradient(device):
    q, k, v = qkv(1, 20, 20, 2, 1, 16, dtypes(device)[0], device, 1)
    scores = torch.randn(1, 1, 20, device=device, requires_grad=True)
    flash_dma.dynamic_mask_attention(q, k, v, scores, 5, add_scores=False).sum().backward()
    assert torch.count_nonzero(scores.grad) == 0


@pytest.mark.parametrize("causal", [True, False])
def test_select_keys_matches_brute_force(device, causal):
    g = torch.Generator().manual_seed(4)
    scores = (torch.randint(-3, 4, (2, 3, 50), generator=g).float() / 2).to(device)  # many ties
    padding = (torch.rand(2, 50, generator=g) < 0.9).to(device)
    for w in (1, 7, 50, 60):
        sel = flash_dma.select_keys(scores, w, num_queries=40, is_causal=causal, key_padding_mask=padding)
        assert sel.begin.dtype == torch.int32 and sel.begin.shape == (2, 3, 50)
        assert torch.equal(sel.kept(40), select_ref(scores, w, 40, causal, padding))


def test_flash_dmattn_shim(device):
    dtype = dtypes(device)[0]
    q, k, v = qkv(2, 30, 30, 4, 4, 32, dtype, device, 2)
    mask = (torch.rand(2, 4, 30, 30, generator=torch.Generator().manual_seed(1)) < 0.7).to(device)
    bias = rand((2, 4, 30, 30), dtype, device, 3)
    out = flash_dma.flash_dmattn_func(q, k, v, attn_mask=mask, attn_bias=bias, is_causal=True)
    assert_close(out, attention_ref(q, k, v, mask=mask, bias=bias, causal=True), dtype, "shim out")
    out2, lse = flash_dma.flash_dmattn_func(q, k, v, attn_mask=mask, attn_bias=bias, is_causal=True,
                                            return_attn_probs=True)
    assert torch.equal(out, out2) and lse.shape == (2, 4, 30)


def test_opcheck(device):
    dtype = dtypes(device)[0]
    q, k, v = (t.detach() for t in qkv(1, 16, 24, 4, 2, 16, dtype, device, 9))
    bias = rand((1, 2, 1, 24), dtype, device, 4)
    mask = torch.ones(1, 1, 16, 24, dtype=torch.bool, device=device)
    scores = torch.randn(1, 2, 24, device=device)
    opcheck = torch.library.opcheck
    opcheck(torch.ops.flash_dma.attention_fwd, (q, k, v, mask, bias.requires_grad_(), True, 0.0, 0.0, False))
    opcheck(torch.ops.flash_dma.dma_fwd, (q, k, v, scores.requires_grad_(), None, 5, True, True, 0.0, 0.0, False))
    opcheck(torch.ops.flash_dma.select, (scores.detach(), None, 16, 5, True))


@pytest.mark.parametrize("causal", [False, True])
def test_dma_backward_reuses_the_forwards_selection(device, causal):
    # dma_fwd returns its selection (select_keys' intervals); dma_bwd given them computes the
    # same gradients as when it selects again (bitwise: deterministic backwards).
    dtype = dtypes(device)[0]
    q, k, v = (t.detach() for t in qkv(2, 40, 50, 4, 2, 32, dtype, device, 21))
    scores = rand((2, 2, 50), dtype, device, 22)
    padding = torch.rand(2, 50, generator=torch.Generator().manual_seed(3)) < 0.9
    padding = padding.to(device)
    args = (scores, padding, 9, causal, True, 0.0, 0.0, False)
    out, lse, begin, end = torch.ops.flash_dma.dma_fwd(q, k, v, *args)
    sel = flash_dma.select_keys(scores, 9, num_queries=40, is_causal=causal, key_padding_mask=padding)
    assert torch.equal(begin, sel.begin) and torch.equal(end, sel.end)
    dout = rand(out.shape, dtype, device, 23)
    rest = (9, causal, True, 0.0, 0.0, True)  # deterministic: compared bitwise
    reused = torch.ops.flash_dma.dma_bwd(dout, q, k, v, scores, padding, out, lse, begin, end, *rest)
    selected = torch.ops.flash_dma.dma_bwd(dout, q, k, v, scores, padding, out, lse, None, None, *rest)
    for a, b in zip(reused, selected):
        assert torch.equal(a, b)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_torch_compile_fullgraph(device, backend):
    dtype = dtypes(device)[0]
    q, k, v = qkv(1, 24, 24, 2, 1, 16, dtype, device, 10)
    scores = torch.randn(1, 1, 24, device=device, requires_grad=True)

    def step(q, k, v, scores):  # torch ops around the custom ops, for inductor to fuse
        a = flash_dma.attention(q * 0.5, k, v, is_causal=True)
        b = flash_dma.dynamic_mask_attention(q, k, v, scores.tanh(), 6)
        return (a * b).sum()

    compiled = torch.compile(step, fullgraph=True, backend=backend)
    loss = compiled(q, k, v, scores)
    loss.backward()
    grads = [t.grad.clone() for t in (q, k, v, scores)]
    for t in (q, k, v, scores):
        t.grad = None
    step(q, k, v, scores).backward()
    for a, b in zip(grads, (t.grad for t in (q, k, v, scores))):
        # inductor fuses and reorders the float32 math around the ops (scores are float32)
        assert_close(a, b, torch.float32 if dtype == torch.float64 else dtype, f"{backend} gradient")


def test_cuda_graph_replay(device):
    if device.type != "cuda":
        pytest.skip("CUDA graphs need a GPU")
    q, k, v = (t.detach() for t in qkv(1, 256, 256, 4, 2, 64, torch.bfloat16, device, 11))
    scores = torch.randn(1, 2, 256, device=device)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm up outside capture
        flash_dma.dynamic_mask_attention(q, k, v, scores, 32)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = flash_dma.dynamic_mask_attention(q, k, v, scores, 32)
    q.copy_(torch.randn_like(q))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, flash_dma.dynamic_mask_attention(q, k, v, scores, 32))


def test_nn_module_trains_its_key_importance(device):
    dtype = dtypes(device)[0]
    torch.manual_seed(0)
    m = flash_dma.nn.DynamicMaskAttention(num_heads=4, num_kv_heads=2, head_dim=16, window_size=6).to(device, dtype)
    q, k, v = qkv(2, 20, 20, 4, 2, 16, dtype, device, 12)
    out = m(q, k, v)
    out.square().sum().backward()
    assert m.A.grad is not None and torch.count_nonzero(m.A.grad) > 0
    assert torch.count_nonzero(m.dt_proj.weight.grad) > 0
    # Against the reference with the same scores and selection.
    scores = m.key_scores(v).detach()
    keep = select_ref(scores, 6, 20, True)
    assert_close(out, attention_ref(q, k, v, mask=keep, bias=scores.unsqueeze(2)), dtype, "module out")


def test_bad_inputs_raise_clear_errors(device):
    dtype = dtypes(device)[0]
    q, k, v = (t.detach() for t in qkv(1, 8, 8, 2, 1, 16, dtype, device, 13))
    scores = torch.randn(1, 1, 8, device=device)
    with pytest.raises(TypeError, match="share a dtype"):
        flash_dma.attention(q, k.to(torch.float16 if dtype != torch.float16 else torch.float32), v)
    with pytest.raises(TypeError, match="int32 are not supported|not supported"):
        flash_dma.attention(q.int(), k.int(), v.int())
    with pytest.raises(ValueError, match="contiguous head dim"):
        flash_dma.attention(q.transpose(1, 3).contiguous().transpose(1, 3), k, v)
    with pytest.raises(ValueError, match="head dims up to 256"):
        big = torch.zeros(1, 4, 2, 264, dtype=dtype, device=device)
        flash_dma.attention(big, big[:, :, :1], big[:, :, :1])
    with pytest.raises(ValueError, match="broadcast|shape|dims"):
        flash_dma.attention(q, k, v, attn_bias=torch.zeros(1, 3, 8, 8, dtype=dtype, device=device))
    with pytest.raises(TypeError, match="torch.bool"):
        flash_dma.attention(q, k, v, attn_mask=torch.ones(1, 1, 8, 8, device=device))
    with pytest.raises(ValueError, match="multiple of Hk|H % Hk|divisible"):
        kv2 = torch.zeros(1, 8, 2, 16, dtype=dtype, device=device)
        flash_dma.attention(torch.zeros(1, 8, 3, 16, dtype=dtype, device=device), kv2, kv2)
    with pytest.raises(ValueError, match="window_size"):
        flash_dma.dynamic_mask_attention(q, k, v, scores, 0)
    with pytest.raises(ValueError, match="window_size"):
        flash_dma.dynamic_mask_attention(q, k, v, scores, 2.5)
    with pytest.raises(ValueError, match="batch, seqlen, heads, head_dim"):
        flash_dma.attention(q[0], k[0], v[0])
    if device.type == "cpu" and torch.cuda.is_available():
        with pytest.raises(ValueError, match="device"):
            flash_dma.attention(q, k.cuda(), v)


def test_available_backends():
    backends = flash_dma.get_available_backends()
    assert backends[0] == "cpu"
    assert ("cuda" in backends) == (torch.cuda.is_available() and "cuda" in backends)


@pytest.mark.parametrize("B, Sq, Sk", [(0, 5, 7), (2, 0, 7), (2, 5, 0)])
def test_empty_problems(device, B, Sq, Sk):
    """No batch, query or key: empty outputs, or out 0 and lse -inf where no key is attended,
    and zero gradients, as SDPA and FlashAttention return them."""
    dtype = dtypes(device)[0]
    q, k, v = qkv(B, Sq, Sk, 4, 2, 16, dtype, device, 31)
    scores = torch.randn(B, 2, Sk, device=device, requires_grad=True)
    bias = torch.randn(1, 1, 1, Sk, device=device, requires_grad=True)
    for name, call in [
        ("attention", lambda: flash_dma.attention(q, k, v, attn_bias=bias, is_causal=True, return_lse=True)),
        ("dynamic_mask_attention", lambda: flash_dma.dynamic_mask_attention(q, k, v, scores, 3, return_lse=True)),
    ]:
        for t in (q, k, v, scores, bias):
            t.grad = None
        out, lse = call()
        assert out.shape == (B, Sq, 4, 16) and lse.shape == (B, 4, Sq), name
        assert torch.all(out == 0) and torch.all(lse == float("-inf")), name
        out.sum().backward()
        for t, what in [(q, "dq"), (k, "dk"), (v, "dv")] + ([(bias, "dbias")] if name == "attention" else
                                                             [(scores, "dkey_scores")]):
            assert t.grad is not None and t.grad.shape == t.shape and torch.all(t.grad == 0), f"{name} {what}"
