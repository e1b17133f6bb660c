"""flash_dma's KV-cache calls (the inference path) against dynamic_mask_attention / attention
on each sequence's own contiguous tensors and against the float64 reference: ragged lengths,
paged caches with shuffled pages, appended tokens, GQA, dense attention; torch.compile with
fullgraph; CUDA graph capture of a decode loop (on CUDA); bad input.

`pytest tests/python --device cuda` runs them on the GPU.
"""
import pytest
import torch

import flash_dma
from reference import attention_ref, select_ref


def rand(shape, dtype, device, seed, lo=-1.0, hi=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(shape, generator=g, dtype=torch.float64) * (hi - lo) + lo).to(device=device, dtype=dtype)


def dtype_of(device):
    return torch.float32 if device.type == "cpu" else torch.bfloat16


def tol(dtype):
    return {torch.float32: 2e-4, torch.bfloat16: 3e-2, torch.float16: 5e-3}[dtype]


class Cache:
    """Random contiguous caches [B, max_len, Hk, D] / [B, Hk, max_len] and, with page_size, the
    same content in shuffled pages [num_pages, page_size, Hk, D] / [num_pages, page_size, Hk]."""

    def __init__(self, B, max_len, Hk, D, dtype, device, seed, page_size=0):
        self.k = rand((B, max_len, Hk, D), dtype, device, seed)
        self.v = rand((B, max_len, Hk, D), dtype, device, seed + 1)
        self.s = rand((B, Hk, max_len), torch.float32, device, seed + 2, -2, 2)
        self.page_size = page_size
        if page_size:
            pages = (max_len + page_size - 1) // page_size
            g = torch.Generator().manual_seed(seed + 3)
            perm = torch.randperm(B * pages + 2, generator=g)[: B * pages].to(torch.int32)
            self.table = perm.view(B, pages).to(device)
            n = B * pages + 2
            self.kp = torch.zeros((n, page_size, Hk, D), dtype=dtype, device=device)
            self.vp = torch.zeros_like(self.kp)
            self.sp = torch.zeros((n, page_size, Hk), dtype=torch.float32, device=device)
            for b in range(B):
                for p in range(pages):
                    lo, hi = p * page_size, min(max_len, (p + 1) * page_size)
                    page = int(self.table[b, p])
                    self.kp[page, : hi - lo] = self.k[b, lo:hi]
                    self.vp[page, : hi - lo] = self.v[b, lo:hi]
                    self.sp[page, : hi - lo] = self.s[b, :, lo:hi].transpose(0, 1)

    def args(self):
        if self.page_size:
            return dict(k_cache=self.kp, v_cache=self.vp, score_cache=self.sp, block_table=self.table)
        return dict(k_cache=self.k, v_cache=self.v, score_cache=self.s)


@pytest.mark.parametrize("page_size", [0, 16])
@pytest.mark.parametrize("Sq", [1, 4])
@pytest.mark.parametrize("heads", [(4, 4), (8, 2)])
def test_dynamic_kvcache_matches_per_sequence_calls(device, page_size, Sq, heads):
    H, Hk = heads
    B, D, w, max_len = 4, 32, 10, 70
    dtype = dtype_of(device)
    c = Cache(B, max_len, Hk, D, dtype, device, seed=11 + Sq + H, page_size=page_size)
    lens = torch.tensor([0, 5, 10, 70], dtype=torch.int32, device=device)
    q = rand((B, Sq, H, D), dtype, device, 5)
    out, lse = flash_dma.dynamic_mask_attention_with_kvcache(q, cache_seqlens=lens, window_size=w, return_lse=True,
                                                             **c.args())
    for b in range(B):
        L = int(lens[b])
        if L == 0:
            assert torch.all(out[b] == 0) and torch.all(lse[b] == float("-inf"))
            continue
        kb, vb, sb = c.k[b:b + 1, :L], c.v[b:b + 1, :L], c.s[b:b + 1, :, :L]
        expect = flash_dma.dynamic_mask_attention(q[b:b + 1], kb, vb, sb, window_size=w)
        scale = max(1.0, expect.abs().max().item())
        assert (out[b:b + 1].double() - expect.double()).abs().max().item() <= tol(dtype) * scale
        keep = select_ref(sb, w, Sq, True)  # [1, Hk, Sq, L]
        ref = attention_ref(q[b:b + 1], kb, vb, mask=keep, bias=sb.unsqueeze(2))
        assert (out[b:b + 1].double() - ref).abs().max().item() <= tol(dtype) * max(1.0, ref.abs().max().item())


@pytest.mark.parametrize("page_size", [0, 16])
def test_appends_new_tokens_before_attending(device, page_size):
    B, Hk, H, D, w, max_len, Snew = 2, 2, 4, 16, 6, 48, 3
    dtype = dtype_of(device)
    c = Cache(B, max_len, Hk, D, dtype, device, seed=31, page_size=page_size)
    lens = torch.tensor([4, 40], dtype=torch.int32, device=device)
    k, v = rand((B, Snew, Hk, D), dtype, device, 40), rand((B, Snew, Hk, D), dtype, device, 41)
    s = rand((B, Hk, Snew), torch.float32, device, 42, -2, 2)
    q = rand((B, Snew, H, D), dtype, device, 43)
    out = flash_dma.dynamic_mask_attention_with_kvcache(q, cache_seqlens=lens, window_size=w, k=k, v=v, scores=s,
                                                        **c.args())
    for b in range(B):
        L0 = int(lens[b])
        c.k[b, L0:L0 + Snew], c.v[b, L0:L0 + Snew], c.s[b, :, L0:L0 + Snew] = k[b], v[b], s[b]
        L = L0 + Snew
        expect = flash_dma.dynamic_mask_attention(q[b:b + 1], c.k[b:b + 1, :L], c.v[b:b + 1, :L],
                                                  c.s[b:b + 1, :, :L], window_size=w)
        assert (out[b:b + 1].float() - expect.float()).abs().max().item() <= tol(dtype)
        if page_size:  # the new rows landed on the sequence's pages
            for t in range(Snew):
                page, slot = int(c.table[b, (L0 + t) // page_size]), (L0 + t) % page_size
                assert torch.equal(c.kp[page, slot], k[b, t]) and torch.equal(c.sp[page, slot], s[b, :, t])


@pytest.mark.parametrize("page_size", [0, 16])
def test_dense_kvcache_matches_attention(device, page_size):
    B, Hk, H, D, max_len, Sq = 3, 1, 4, 32, 40, 2
    dtype = dtype_of(device)
    c = Cache(B, max_len, Hk, D, dtype, device, seed=51, page_size=page_size)
    a = c.args()
    a.pop("score_cache")
    lens = torch.tensor([1, 17, 40], dtype=torch.int32, device=device)
    q = rand((B, Sq, H, D), dtype, device, 52)
    out = flash_dma.attention_with_kvcache(q, cache_seqlens=lens, **a)
    for b in range(B):
        L = int(lens[b])
        expect = flash_dma.attention(q[b:b + 1], c.k[b:b + 1, :L], c.v[b:b + 1, :L], is_causal=True)
        assert (out[b:b + 1].float() - expect.float()).abs().max().item() <= tol(dtype)


def test_compiles_with_fullgraph(device):
    B, Hk, H, D, w, max_len = 2, 2, 4, 16, 8, 64
    dtype = dtype_of(device)
    c = Cache(B, max_len, Hk, D, dtype, device, seed=61, page_size=16)
    lens = torch.tensor([20, 63], dtype=torch.int32, device=device)
    q = rand((B, 1, H, D), dtype, device, 62)
    eager = flash_dma.dynamic_mask_attention_with_kvcache(q, cache_seqlens=lens, window_size=w, **c.args())

    @torch.compile(fullgraph=True)
    def step(q, lens):
        return flash_dma.dynamic_mask_attention_with_kvcache(q, cache_seqlens=lens, window_size=w, **c.args())

    assert torch.equal(step(q, lens), eager)


@pytest.mark.parametrize("with_state", [False, True])
def test_cuda_graph_decode_loop(device, with_state):
    if device.type != "cuda":
        pytest.skip("CUDA graphs need a GPU")
    B, Hk, H, D, w, max_len, steps = 2, 2, 8, 64, 16, 256, 5
    dtype = torch.bfloat16
    c = Cache(B, max_len, Hk, D, dtype, device, seed=71, page_size=16)
    ref = Cache(B, max_len, Hk, D, dtype, device, seed=71, page_size=16)
    lens = torch.tensor([30, 100], dtype=torch.int32, device=device)
    q = torch.zeros((B, 1, H, D), dtype=dtype, device=device)
    k, v = torch.zeros((B, 1, Hk, D), dtype=dtype, device=device), torch.zeros((B, 1, Hk, D), dtype=dtype, device=device)
    s = torch.zeros((B, Hk, 1), dtype=torch.float32, device=device)
    state = flash_dma.new_select_state(c.kp, w, c.table) if with_state else None

    def step():
        return flash_dma.dynamic_mask_attention_with_kvcache(q, cache_seqlens=lens, window_size=w, k=k, v=v, scores=s,
                                                             select_state=state, **c.args())

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()  # warm-up (workspace sizes, module load); appends at 30 and 100, overwritten below
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    ref_lens = lens.clone()
    for t in range(steps):
        q.copy_(rand(q.shape, dtype, device, 100 + t))
        k.copy_(rand(k.shape, dtype, device, 200 + t))
        v.copy_(rand(v.shape, dtype, device, 300 + t))
        s.copy_(rand(s.shape, torch.float32, device, 400 + t, -2, 2))
        graph.replay()
        expect = flash_dma.dynamic_mask_attention_with_kvcache(q, cache_seqlens=ref_lens, window_size=w, k=k, v=v,
                                                               scores=s, **ref.args())
        torch.cuda.synchronize()
        if with_state:  # the same keys, listed in another order: sums round differently
            torch.testing.assert_close(out, expect, atol=tol(dtype), rtol=0, msg=f"step {t}")
        else:
            assert torch.equal(out, expect), f"step {t}"
        lens += 1
        ref_lens += 1
    if with_state:  # the last replay appended at 30 + steps - 1 and 100 + steps - 1
        assert state[0, :, 0].tolist() == [30 + steps] * Hk and state[1, :, 0].tolist() == [100 + steps] * Hk


@pytest.mark.parametrize("page_size", [0, 16])
def test_select_state_decode_loop(device, page_size):
    """A generation loop that passes select_state gives what the same loop without it gives,
    and leaves each row's top-w positions and their scores in the state."""
    B, Hk, H, D, w, max_len, steps = 3, 2, 4, 32, 12, 160, 6
    dtype = dtype_of(device)
    a = Cache(B, max_len, Hk, D, dtype, device, seed=91, page_size=page_size)
    b = Cache(B, max_len, Hk, D, dtype, device, seed=91, page_size=page_size)
    state = flash_dma.new_select_state(a.args()["k_cache"], w, a.args().get("block_table"))
    assert state.shape == (B, Hk, 1 + 2 * w) and state.dtype == torch.int32 and not state.any()
    lens = torch.tensor([0, 11, 90], dtype=torch.int32, device=device)
    for t in range(steps):
        q = rand((B, 1, H, D), dtype, device, 500 + t)
        k, v = rand((B, 1, Hk, D), dtype, device, 600 + t), rand((B, 1, Hk, D), dtype, device, 700 + t)
        s = rand((B, Hk, 1), torch.float32, device, 800 + t, -2, 2)
        got = flash_dma.dynamic_mask_attention_with_kvcache(q, cache_seqlens=lens, window_size=w, k=k, v=v, scores=s,
                                                            select_state=state, **a.args())
        want = flash_dma.dynamic_mask_attention_with_kvcache(q, cache_seqlens=lens, window_size=w, k=k, v=v, scores=s,
                                                             **b.args())
        torch.testing.assert_close(got, want, atol=tol(dtype), rtol=0, msg=f"step {t}")
        lens += 1
    scores = b.s.clone()  # the contiguous copy holds no appends when paged: rebuild the logical scores
    if page_size:
        pages = b.table.long()
        scores = b.sp[pages].permute(0, 3, 1, 2).reshape(B, Hk, -1)[:, :, :max_len]
    for bi in range(B):
        L = int(lens[bi])
        for h in range(Hk):
            row = scores[bi, h, :L].double().cpu()
            top = sorted(sorted(range(L), key=lambda j: (-row[j].item(), j))[: min(w, L)])
            assert state[bi, h, 0].item() == L
            assert state[bi, h, 1 : 1 + len(top)].tolist() == top, (bi, h)
            kept_scores = state[bi, h, 1 + w: 1 + w + len(top)].view(torch.float32).cpu()
            assert torch.equal(kept_scores, scores[bi, h, top].float().cpu()), (bi, h)


def test_bad_input_names_the_argument(device):
    B, Hk, H, D = 2, 2, 4, 16
    dtype = dtype_of(device)
    c = Cache(B, 32, Hk, D, dtype, device, seed=81)
    q = rand((B, 1, H, D), dtype, device, 82)
    lens = torch.tensor([3, 5], dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match="window_size"):
        flash_dma.dynamic_mask_attention_with_kvcache(q, cache_seqlens=lens, window_size=0, **c.args())
    with pytest.raises(TypeError, match="cache_seqlens"):
        flash_dma.dynamic_mask_attention_with_kvcache(q, cache_seqlens=lens.long(), window_size=4, **c.args())
    with pytest.raises(ValueError, match="k and v go together"):
        flash_dma.dynamic_mask_attention_with_kvcache(q, cache_seqlens=lens, window_size=4, k=c.k[:, :1], **c.args())
    bad = c.args()
    bad["score_cache"] = bad["score_cache"][:, :1]
    with pytest.raises(ValueError, match="score_cache.shape"):
        flash_dma.dynamic_mask_attention_with_kvcache(q, cache_seqlens=lens, window_size=4, **bad)
    with pytest.raises(TypeError, match="select_state must be an int32 tensor"):
        flash_dma.dynamic_mask_attention_with_kvcache(q, cache_seqlens=lens, window_size=4, **c.args(),
                                                      select_state=torch.zeros((B, Hk, 5), dtype=torch.int64,
                                                                               device=device))
    with pytest.raises(ValueError, match=r"select_state.shape\[2\]"):
        flash_dma.dynamic_mask_attention_with_kvcache(q, cache_seqlens=lens, window_size=4, **c.args(),
                                                      select_state=torch.zeros((B, Hk, 5), dtype=torch.int32,
                                                                               device=device))
    if device.type == "cpu":  # the CPU reads the lengths; the GPU clamps them instead
        with pytest.raises(ValueError, match=r"cache_seqlens\[1\]"):
            flash_dma.dynamic_mask_attention_with_kvcache(q, cache_seqlens=torch.tensor([3, 33], dtype=torch.int32),
                                                          window_size=4, **c.args())


def test_full_caches_without_cache_seqlens(device):
    """cache_seqlens=None: every sequence holds the whole cache."""
    B, Hk, H, D, w, max_len = 2, 2, 4, 16, 8, 48
    dtype = dtype_of(device)
    c = Cache(B, max_len, Hk, D, dtype, device, seed=95, page_size=16)
    q = rand((B, 3, H, D), dtype, device, 96)
    full = torch.full((B,), max_len, dtype=torch.int32, device=device)
    want = flash_dma.dynamic_mask_attention_with_kvcache(q, cache_seqlens=full, window_size=w, **c.args())
    got = flash_dma.dynamic_mask_attention_with_kvcache(q, cache_seqlens=None, window_size=w, **c.args())
    assert torch.equal(got, want)
    with pytest.raises(ValueError, match="appended at cache_seqlens"):
        flash_dma.dynamic_mask_attention_with_kvcache(q, cache_seqlens=None, window_size=w, k=c.k[:, :1],
                                                      v=c.v[:, :1], scores=c.s[:, :, :1].contiguous(), **c.args())


@pytest.mark.parametrize("causal", [True, False])
def test_dynamic_mask_attention_inference_takes_the_decode_path(device, causal):
    """dynamic_mask_attention without gradients and with few queries (the decode path on CUDA)
    against the same call with gradients enabled (the training kernels)."""
    B, Hk, H, D, w, Sk = 2, 2, 8, 64, 24, 700
    dtype = dtype_of(device)
    c = Cache(B, Sk, Hk, D, dtype, device, seed=97)
    for Sq in (1, 5, 16):
        q = rand((B, Sq, H, D), dtype, device, 98 + Sq)
        with torch.no_grad():
            fast, fast_lse = flash_dma.dynamic_mask_attention(q, c.k, c.v, c.s, w, is_causal=causal, return_lse=True)
        qg = q.clone().requires_grad_()
        slow, slow_lse = flash_dma.dynamic_mask_attention(qg, c.k, c.v, c.s, w, is_causal=causal, return_lse=True)
        torch.testing.assert_close(fast, slow.detach(), atol=tol(dtype), rtol=0)
        torch.testing.assert_close(fast_lse, slow_lse.detach(), atol=1e-3, rtol=0)
