"""transformers' own Doge model code against the same model switched to flash_dma by
flash_dma.integrations.transformers.enable: loss, logits and every parameter's gradient
(A and dt_proj included) in training with the top-w active and with a padded batch, and greedy
generation through the cache. Token sequences never repeat a token: a repeated token repeats
its value and so its score, and torch.topk (transformers' path) breaks ties in no set order.
"""
import copy

import pytest
import torch

pytest.importorskip("transformers")
from transformers import DogeConfig, DogeForCausalLM  # noqa: E402

import flash_dma  # noqa: E402


def tiny_doge(device, dtype, keep_window_size=8):
    torch.manual_seed(0)
    config = DogeConfig(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, keep_window_size=keep_window_size,
                        max_position_embeddings=256, attention_dropout=0.0, hidden_dropout=0.0)
    config._attn_implementation = "eager"
    model = DogeForCausalLM(config)
    with torch.no_grad():  # A starts at 0 (every score 1): make the scores differ per key
        for layer in model.model.layers:
            layer.self_attn.A.normal_(0, 1)
    return model.to(device=device, dtype=dtype)


def tokens(B, S, device, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.stack([torch.randperm(128, generator=g)[:S] for _ in range(B)]).to(device)


def dtype_for(device):
    return torch.float32 if device.type == "cpu" else torch.bfloat16


def tol(dtype):
    return 1e-4 if dtype == torch.float32 else 5e-2


def run(model, ids, mask, labels):
    model.zero_grad()
    out = model(input_ids=ids, attention_mask=mask, labels=labels)
    out.loss.backward()
    return out.loss.detach(), out.logits.detach(), {n: p.grad.detach().clone() for n, p in model.named_parameters()
                                                    if p.grad is not None}


@pytest.mark.parametrize("padded", [False, True])
def test_training_matches_transformers(device, padded):
    dtype = dtype_for(device)
    ref = tiny_doge(device, dtype)
    ours = flash_dma.integrations.transformers.enable(copy.deepcopy(ref))
    B, S = 2, 40  # S > keep_window_size: the top-w is active
    ids = tokens(B, S, device, seed=1)
    mask = torch.ones(B, S, dtype=torch.long, device=device)
    labels = ids.clone()
    if padded:  # right padding on the second sequence
        mask[1, 30:] = 0
        labels[1, 30:] = -100
    loss_r, logits_r, grads_r = run(ref, ids, mask, labels)
    loss_o, logits_o, grads_o = run(ours, ids, mask, labels)
    t = tol(dtype)
    assert abs(loss_r.item() - loss_o.item()) <= t * max(1.0, abs(loss_r.item()))
    real = mask.bool()
    assert (logits_r[real].float() - logits_o[real].float()).abs().max().item() <= t * max(
        1.0, logits_r[real].abs().max().item())
    assert grads_r.keys() == grads_o.keys()
    for name in grads_r:
        g_r, g_o = grads_r[name].float(), grads_o[name].float()
        scale = max(1e-3, g_r.abs().max().item())
        assert (g_r - g_o).abs().max().item() <= 10 * t * scale, name
    assert any("dt_proj" in n for n in grads_o) and any(n.endswith(".A") for n in grads_o)


def test_greedy_generation_matches_transformers(device, monkeypatch):
    # On the GPU the model runs in float16, whose scores tie often enough that torch.topk's
    # arbitrary tie order changes the selection: there the window holds every key (the decode
    # path end to end); the top-w under generate() is compared on the CPU, in float32.
    dtype = torch.float32 if device.type == "cpu" else torch.float16
    ref = tiny_doge(device, dtype, keep_window_size=6 if device.type == "cpu" else 64)
    ours = flash_dma.integrations.transformers.enable(copy.deepcopy(ref))
    from flash_dma.integrations import doge

    decode_calls = []
    kvcache = doge.dynamic_mask_attention_with_kvcache
    monkeypatch.setattr(doge, "dynamic_mask_attention_with_kvcache",
                        lambda *a, **k: decode_calls.append(1) or kvcache(*a, **k))
    ids = tokens(2, 12, device, seed=2)
    mask = torch.ones_like(ids)
    kw = dict(max_new_tokens=10, do_sample=False, attention_mask=mask, pad_token_id=0)
    with torch.no_grad():
        out_r = ref.generate(ids, **kw)
        out_o = ours.generate(ids, **kw)
    assert torch.equal(out_r, out_o)
    assert len(decode_calls) == 10 * 2  # the 12-token prompt and every step, both layers: the KV-cache path


def test_enable_needs_doge_layers():
    from transformers import LlamaConfig, LlamaForCausalLM

    model = LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2))
    with pytest.raises(ValueError, match="DogeAttention"):
        flash_dma.integrations.transformers.enable(model)


@pytest.mark.parametrize("with_cu_seq_lens", [True, False])
def test_padding_free_matches_transformers_per_sequence(device, with_cu_seq_lens):
    # One row packing three sequences (transformers' padding-free batches): through flash_dma,
    # dynamic_mask_attention_varlen with each sequence its own problem, from the cu_seq_lens
    # keyword arguments or from position_ids restarting at 0. Against transformers' own model
    # on each sequence alone, same device and dtype (bf16 scores tie, and a float32 reference
    # would keep other keys): logits, and every parameter's gradient summed over the sequences
    # (in bf16 the gradients as one vector: A's is a sum that cancels to below bf16's rounding
    # of its terms, measured 0.032 against 0.0005 on the H100).
    dtype = dtype_for(device)
    ref = tiny_doge(device, dtype)
    ours = flash_dma.integrations.transformers.enable(copy.deepcopy(ref))
    lens = [17, 9, 23]  # above keep_window_size 8: the top-w is active in two of them
    ids = tokens(1, sum(lens), device, seed=5)  # no token repeats across the packed row
    pos = torch.cat([torch.arange(n) for n in lens]).view(1, -1).to(device)
    weight = torch.randn(1, sum(lens), 128, generator=torch.Generator().manual_seed(6))
    kwargs = {}
    if with_cu_seq_lens:
        cu = torch.tensor([0, 17, 26, 49], dtype=torch.int32, device=device)
        kwargs = dict(cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=23, max_length_k=23)
    ours.zero_grad()
    logits = ours(input_ids=ids, position_ids=pos, **kwargs).logits
    (logits.float() * weight.to(device)).sum().backward()
    got = {n: p.grad.detach().float().cpu() for n, p in ours.named_parameters() if p.grad is not None}

    ref.zero_grad()
    start, ref_logits = 0, []
    for n in lens:
        part = ref(input_ids=ids[:, start:start + n]).logits
        (part.float() * weight[:, start:start + n].to(device)).sum().backward()
        ref_logits.append(part.detach().float().cpu())
        start += n
    t = tol(dtype)
    assert torch.allclose(logits.detach().float().cpu(), torch.cat(ref_logits, dim=1), atol=t, rtol=t)
    want = {n: p.grad.detach().float().cpu() for n, p in ref.named_parameters() if p.grad is not None}
    assert got.keys() == want.keys()
    if dtype == torch.float32:
        for n in want:
            scale = want[n].abs().max().item() + 1e-6
            assert (got[n] - want[n]).abs().max().item() <= 20 * t * scale, n
    else:
        g, w = torch.cat([got[n].flatten() for n in want]), torch.cat([want[n].flatten() for n in want])
        rel = ((g - w).norm() / w.norm()).item()
        assert rel <= 0.05, f"relative gradient error {rel:.3g}"
