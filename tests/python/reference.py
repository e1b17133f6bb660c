"""float64 PyTorch references for the tests: dense masked attention and brute-force top-w."""
import torch


def attention_ref(q, k, v, mask=None, bias=None, causal=False, scale=None, softcap=0.0):
    """q [B, Sq, H, D], k/v [B, Sk, Hk, D]; mask/bias broadcastable to [B, H, Sq, Sk]."""
    B, Sq, H, D = q.shape
    Sk, Hk = k.shape[1], k.shape[2]
    G = H // Hk
    qf, kf, vf = (x.double().transpose(1, 2) for x in (q, k, v))
    kf, vf = kf.repeat_interleave(G, 1), vf.repeat_interleave(G, 1)
    s = torch.einsum("bhid,bhjd->bhij", qf, kf) * (scale or D ** -0.5)
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    keep = torch.ones(B, H, Sq, Sk, dtype=torch.bool, device=q.device)
    if mask is not None:
        keep = keep & expand_heads(mask, H, G)
    if causal:
        i = torch.arange(Sq, device=q.device).view(-1, 1)
        j = torch.arange(Sk, device=q.device).view(1, -1)
        keep = keep & (j <= i + Sk - Sq)
    if bias is not None:
        s = s + expand_heads(bias, H, G).double()
    s = s.masked_fill(~keep, float("-inf"))
    p = torch.softmax(s, -1).nan_to_num(0.0)  # rows with nothing visible: zeros
    return torch.einsum("bhij,bhjd->bhid", p, vf).transpose(1, 2)


def expand_heads(t, H, G):
    """A [.., 1|Hk|H, .., ..] tensor broadcast to H heads (query head h reads KV head h // G)."""
    if t.dim() < 4:
        t = t.view((1,) * (4 - t.dim()) + tuple(t.shape))
    if t.shape[1] not in (1, H):
        t = t.repeat_interleave(G, 1)
    return t


def select_ref(scores, w, num_queries, causal, padding=None):
    """Brute force: [B, Hk, Sq, Sk] bool, query i keeps the top-w keys among those it may see
    (causal: j <= i + Sk - Sq), ties to the lower index, padding never kept."""
    B, Hk, Sk = scores.shape
    Sq = num_queries
    order = torch.sort(-scores.double(), dim=-1, stable=True).indices  # best first, ties by index
    rank = torch.empty_like(order)
    rank.scatter_(-1, order, torch.arange(Sk, device=scores.device).expand(B, Hk, Sk))
    cand = torch.ones(B, Hk, Sq, Sk, dtype=torch.bool, device=scores.device)
    if causal:
        i = torch.arange(Sq, device=scores.device).view(-1, 1)
        j = torch.arange(Sk, device=scores.device).view(1, -1)
        cand = cand & (j <= i + Sk - Sq)
    if padding is not None:
        cand = cand & padding.view(B, 1, 1, Sk)
    # better[.., j, j'] = j' ranks above j
    better = rank.unsqueeze(-1) > rank.unsqueeze(-2)  # [B, Hk, Sk, Sk]
    above = (cand.unsqueeze(-2) & better.unsqueeze(2)).sum(-1)  # candidates ranked above j, per query
    return cand & (above < w)
