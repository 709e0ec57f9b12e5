"""Ground truth of the selections, from the full rows on the host (shared by
test_select.py and test_world_sizes.py), with the documented rules: NaN
counts as -inf, ties go to the lower index, columns at or beyond vocab_limit
are excluded. Imports torch: only the modules that need it import this."""

import torch


def logit_rows(rows, vocab, dtype, seed):
    """[rows, vocab] logits on the host, the same for every seed on every
    rank, rows of every kind: ties (a few values only), NaN scattered, all
    NaN, all -inf, +inf."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 64, (rows, vocab), generator=g).float() * 0.25 - 8.0
    for r in range(rows):
        kind = r % 6
        if kind == 1:
            x[r, torch.rand(vocab, generator=g) < 0.2] = float("nan")
        elif kind == 2:
            x[r] = float("nan")
        elif kind == 3:
            x[r] = float("-inf")
        elif kind == 4:
            x[r, torch.randint(0, vocab, (2,), generator=g)] = float("inf")
    return x.to(dtype)


def nan_as_neginf(x):
    x = x.float().cpu()
    return torch.where(torch.isnan(x), torch.full_like(x, float("-inf")), x)


def argmax_ref(x, limit):
    """(values, indices, logsumexp) of every row over its columns below limit."""
    v = nan_as_neginf(x[:, :limit])
    idx = v.argmax(dim=-1)
    return v.gather(1, idx[:, None])[:, 0], idx, torch.logsumexp(x[:, :limit].float().cpu(), -1)


def topk_ref(x, limit, k):
    """(values, indices) of every row's k best below limit, best first."""
    vals, idx = torch.sort(nan_as_neginf(x[:, :limit]), dim=-1, descending=True, stable=True)
    return vals[:, :k], idx[:, :k]
