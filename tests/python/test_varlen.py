"""Packed variable-length batches through the Python layer: attention_varlen and
dynamic_mask_attention_varlen against per-sequence calls of the batched functions (forward, lse
and every gradient), empty and length-1 sequences, GQA, causal and not; opcheck, torch.compile
(fullgraph) and the checks of bad cu_seqlens."""
import pytest
import torch

import flash_dma

# (queries, keys) per sequence: empty sides, length 1, Sq != Sk, lengths off every tile size.
LENGTHS = [([5, 0, 17, 1, 40], [5, 3, 30, 1, 33]), ([0, 70, 2], [4, 65, 0]), ([3], [3])]


def cu(lens, device):
    return torch.tensor([0] + list(torch.tensor(lens).cumsum(0).tolist()), dtype=torch.int32, device=device)


def make(q_lens, k_lens, H, Hk, D, dtype, device, seed):
    g = torch.Generator().manual_seed(seed)
    tq, tk = sum(q_lens), sum(k_lens)
    q = torch.randn(tq, H, D, generator=g).to(device, dtype).requires_grad_()
    k = torch.randn(tk, Hk, D, generator=g).to(device, dtype).requires_grad_()
    v = torch.randn(tk, Hk, D, generator=g).to(device, dtype).requires_grad_()
    scores = torch.randn(Hk, tk, generator=g).to(device).requires_grad_()
    weight = torch.randn(tq, H, D, generator=g).to(device, dtype)
    return q, k, v, scores, weight


def per_sequence(fn, q_lens, k_lens, q, k, v, per_key):
    """fn over each sequence as a batch of one, outputs packed back: out [total_q, H, D], lse [H, total_q]."""
    outs, lses = [], []
    qs, ks = 0, 0
    for nq, nk in zip(q_lens, k_lens):
        keys = [t[..., ks:ks + nk] if t is not None else None for t in per_key]
        out, lse = fn(q[qs:qs + nq].unsqueeze(0), k[ks:ks + nk].unsqueeze(0), v[ks:ks + nk].unsqueeze(0), *keys)
        outs.append(out[0])
        lses.append(lse[0])
        qs, ks = qs + nq, ks + nk
    return torch.cat(outs), torch.cat(lses, dim=1)


def grads_of(loss, tensors):
    return torch.autograd.grad(loss, [t for t in tensors if t is not None and t.requires_grad])


def compare(got, want, device, what):
    # The CPU runs each sequence as the batched call does: bitwise. The GPU's packed tiles
    # meet several sequences and round differently.
    if device.type == "cpu":
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6, msg=what)
    else:
        torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2, msg=what)


@pytest.mark.parametrize("q_lens,k_lens", LENGTHS)
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("heads", [(4, 2), (2, 2), (4, 1)])
def test_dynamic_mask_attention_varlen(device, q_lens, k_lens, causal, heads):
    H, Hk = heads
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    q, k, v, scores, weight = make(q_lens, k_lens, H, Hk, 64, dtype, device, 1)
    padding = (torch.rand(sum(k_lens), generator=torch.Generator().manual_seed(2)) < 0.85).to(device)
    out, lse = flash_dma.dynamic_mask_attention_varlen(q, k, v, scores, cu(q_lens, device), cu(k_lens, device),
                                                       max(q_lens), max(k_lens), 6, is_causal=causal,
                                                       key_padding_mask=padding, return_lse=True)

    def one(q1, k1, v1, s1, p1):
        return flash_dma.dynamic_mask_attention(q1, k1, v1, s1.unsqueeze(0), 6, is_causal=causal,
                                                key_padding_mask=p1.unsqueeze(0), return_lse=True)

    ref_out, ref_lse = per_sequence(one, q_lens, k_lens, q, k, v, [scores, padding])
    if device.type == "cpu":
        assert torch.equal(out, ref_out) and torch.equal(lse, ref_lse)
    compare(out, ref_out, device, "out")
    torch.testing.assert_close(lse, ref_lse, rtol=1e-4, atol=1e-4)
    got = grads_of((out * weight).float().sum(), (q, k, v, scores))
    want = grads_of((ref_out * weight).float().sum(), (q, k, v, scores))
    for name, a, b in zip(("dq", "dk", "dv", "dscores"), got, want):
        compare(a, b, device, name)


@pytest.mark.parametrize("q_lens,k_lens", LENGTHS)
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("bias_heads", [0, 1, 2, 4])
def test_attention_varlen(device, q_lens, k_lens, causal, bias_heads):
    H, Hk = 4, 2
    if device.type == "cuda" and bias_heads == H:
        pytest.skip("a per-query-head bias with grouped heads runs on the CPU only (test_cuda_refuses_...)")
    dtype, D = (torch.float32, 16) if device.type == "cpu" else (torch.bfloat16, 64)
    q, k, v, _, weight = make(q_lens, k_lens, H, Hk, D, dtype, device, 3)
    g = torch.Generator().manual_seed(4)
    bias = torch.randn(bias_heads, sum(k_lens), generator=g).to(device).requires_grad_() if bias_heads else None
    mask = (torch.rand(sum(k_lens), generator=g) < 0.8).to(device) if bias_heads == 2 else None
    out, lse = flash_dma.attention_varlen(q, k, v, cu(q_lens, device), cu(k_lens, device), max(q_lens), max(k_lens),
                                          key_bias=bias, key_mask=mask, is_causal=causal, return_lse=True)

    def one(q1, k1, v1, b1, m1):
        return flash_dma.attention(q1, k1, v1, attn_mask=None if m1 is None else m1.view(1, 1, 1, -1),
                                   attn_bias=None if b1 is None else b1.unsqueeze(1).unsqueeze(0),
                                   is_causal=causal, return_lse=True)

    ref_out, ref_lse = per_sequence(one, q_lens, k_lens, q, k, v, [bias, mask])
    if device.type == "cpu":
        assert torch.equal(out, ref_out) and torch.equal(lse, ref_lse)
    compare(out, ref_out, device, "out")
    torch.testing.assert_close(lse, ref_lse, rtol=1e-4, atol=1e-4)
    got = grads_of((out * weight).float().sum(), (q, k, v, bias))
    want = grads_of((ref_out * weight).float().sum(), (q, k, v, bias))
    for name, a, b in zip(("dq", "dk", "dv", "dbias"), got, want):
        if device.type == "cuda" and name == "dbias":  # a sum over every query of the key's sequence
            torch.testing.assert_close(a, b, rtol=2e-2, atol=5e-2, msg=name)
        else:
            compare(a, b, device, name)


def test_bfloat16_and_one_dim_scores_shapes():
    q_lens, k_lens = [7, 20], [9, 20]
    q, k, v, scores, _ = make(q_lens, k_lens, 2, 1, 32, torch.bfloat16, "cpu", 5)
    out = flash_dma.dynamic_mask_attention_varlen(q, k, v, scores, cu(q_lens, "cpu"), cu(k_lens, "cpu"), 20, 20, 4)
    assert out.shape == q.shape and out.dtype == torch.bfloat16
    out.float().sum().backward()
    assert q.grad.shape == q.shape and scores.grad.shape == scores.shape


def test_opcheck():
    q_lens, k_lens = [5, 0, 9], [6, 2, 9]
    q, k, v, scores, _ = (t.detach() if isinstance(t, torch.Tensor) else t
                          for t in make(q_lens, k_lens, 4, 2, 16, torch.float32, "cpu", 6))
    cq, ck = cu(q_lens, "cpu"), cu(k_lens, "cpu")
    bias = torch.randn(2, 17).requires_grad_()
    opcheck = torch.library.opcheck
    opcheck(torch.ops.flash_dma.attention_fwd, (q, k, v, None, bias, True, 0.0, 0.0, False, cq, ck, 9, 9))
    opcheck(torch.ops.flash_dma.dma_fwd, (q, k, v, scores.requires_grad_(), None, 5, True, True, 0.0, 0.0, False,
                                          True, cq, ck, 9, 9))


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_torch_compile_fullgraph(backend):
    q_lens, k_lens = [12, 3, 20], [12, 8, 20]
    q, k, v, scores, weight = make(q_lens, k_lens, 2, 1, 16, torch.float32, "cpu", 7)
    cq, ck = cu(q_lens, "cpu"), cu(k_lens, "cpu")

    def step(q, k, v, scores):
        a = flash_dma.attention_varlen(q * 0.5, k, v, cq, ck, 20, 20, is_causal=True)
        b = flash_dma.dynamic_mask_attention_varlen(q, k, v, scores.tanh(), cq, ck, 20, 20, 6)
        return (a * b * weight).sum()

    compiled = torch.compile(step, fullgraph=True, backend=backend)
    got = grads_of(compiled(q, k, v, scores), (q, k, v, scores))
    want = grads_of(step(q, k, v, scores), (q, k, v, scores))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_bad_seqlens():
    q, k, v, scores, _ = make([4, 6], [5, 7], 2, 1, 16, torch.float32, "cpu", 8)
    good_q, good_k = cu([4, 6], "cpu"), cu([5, 7], "cpu")
    fn = flash_dma.dynamic_mask_attention_varlen
    with pytest.raises(TypeError, match="cu_seqlens_q must be an int32"):
        fn(q, k, v, scores, good_q.long(), good_k, 6, 7, 3)
    with pytest.raises(ValueError, match="non-decreasing"):
        fn(q, k, v, scores, torch.tensor([0, 11, 10], dtype=torch.int32), good_k, 20, 7, 3)
    with pytest.raises(ValueError, match="expected total_k"):
        fn(q, k, v, scores, good_q, torch.tensor([0, 5, 11], dtype=torch.int32), 6, 7, 3)
    with pytest.raises(ValueError, match="max_seqlen_q = 5"):
        fn(q, k, v, scores, good_q, good_k, 5, 7, 3)
    with pytest.raises(ValueError, match=r"\[total_seqlen, heads, head_dim\]"):
        fn(q.unsqueeze(0), k, v, scores, good_q, good_k, 6, 7, 3)
    with pytest.raises(ValueError, match="key_bias must be"):
        flash_dma.attention_varlen(q, k, v, good_q, good_k, 6, 7, key_bias=torch.zeros(2, 11))


def test_cuda_refuses_per_query_head_bias_with_groups(device):
    if device.type != "cuda":
        pytest.skip("the CUDA backend's answer")
    q, k, v, _, _ = make([4, 6], [5, 7], 2, 1, 64, torch.bfloat16, device, 9)
    bias = torch.zeros(2, 12, device=device)
    with pytest.raises(ValueError, match=r"\[Hk, total_k\]"):
        flash_dma.attention_varlen(q, k, v, cu([4, 6], device), cu([5, 7], device), 6, 7, key_bias=bias)


def test_module_takes_packed_batches():
    torch.manual_seed(0)
    m = flash_dma.nn.DynamicMaskAttention(4, 2, 16, window_size=5)
    q_lens = [6, 13]
    q, k, v, _, _ = make(q_lens, q_lens, 4, 2, 16, torch.float32, "cpu", 10)
    c = cu(q_lens, "cpu")
    out = m(q, k, v, cu_seqlens_q=c, cu_seqlens_k=c, max_seqlen_q=13, max_seqlen_k=13)
    parts = [m(q[a:b].unsqueeze(0), k[a:b].unsqueeze(0), v[a:b].unsqueeze(0))[0] for a, b in ((0, 6), (6, 19))]
    torch.testing.assert_close(out, torch.cat(parts), rtol=1e-6, atol=1e-6)
    out.sum().backward()
    assert m.A.grad is not None and m.dt_proj.weight.grad is not None


def test_flash_dmattn_varlen_shim(device):
    q_lens, k_lens = [6, 0, 10], [8, 3, 10]
    dtype, D = (torch.float32, 16) if device.type == "cpu" else (torch.bfloat16, 64)
    q, k, v, _, _ = make(q_lens, k_lens, 4, 2, D, dtype, device, 11)
    bias = torch.randn(2, sum(k_lens), generator=torch.Generator().manual_seed(12)).to(device)
    cq, ck = cu(q_lens, device), cu(k_lens, device)
    out = flash_dma.flash_dmattn_varlen_func(q, k, v, attn_bias=bias, cu_seqlens_q=cq, cu_seqlens_k=ck,
                                             max_seqlen_q=10, max_seqlen_k=10, is_causal=True)
    want = flash_dma.attention_varlen(q, k, v, cq, ck, 10, 10, key_bias=bias, is_causal=True)
    assert torch.equal(out, want)
    with pytest.raises(ValueError, match="per key"):
        flash_dma.flash_dmattn_varlen_func(q, k, v, attn_bias=torch.zeros(1, 4, 16, 21, device=device),
                                           cu_seqlens_q=cq, cu_seqlens_k=ck, max_seqlen_q=10, max_seqlen_k=10)
    padded = flash_dma.flash_dmattn_varlen_func(q[:6].unsqueeze(0), k[:8].unsqueeze(0), v[:8].unsqueeze(0),
                                                attn_bias=bias[:, :8].reshape(1, 2, 1, 8), is_causal=True)
    if device.type == "cpu":  # the same per-sequence kernels: bitwise
        assert torch.equal(padded[0], want[:6])
    else:  # the dense kernel against the packed batch's gathered one
        torch.testing.assert_close(padded[0].float(), want[:6].float(), rtol=2e-2, atol=2e-2)


def test_cuda_graph_replay_reads_new_offsets(device):
    """The CUDA kernels read cu_seqlens on the device: a captured call replayed after new offsets
    (same totals and max lengths) are copied in computes the new batch."""
    if device.type != "cuda":
        pytest.skip("CUDA graphs need a GPU")
    first, second = [30, 0, 70, 28], [64, 64, 0, 0]
    q, k, v, scores, _ = (t.detach() if isinstance(t, torch.Tensor) else t
                          for t in make(first, first, 4, 2, 64, torch.bfloat16, device, 13))
    cq = cu(first, device)

    def both():
        return (flash_dma.attention_varlen(q, k, v, cq, cq, 70, 70, is_causal=True),
                flash_dma.dynamic_mask_attention_varlen(q, k, v, scores, cq, cq, 70, 70, 16))

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm up outside capture
        both()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = both()
    cq.copy_(cu(second, device))
    q.copy_(torch.randn_like(q))
    graph.replay()
    torch.cuda.synchronize()
    for got, want in zip(outs, both()):
        assert torch.equal(got, want)
