"""Masked reductions: every statistic in ragrl.algos is taken over action tokens only.

`mask` is the action mask [B, T]: 1 on tokens the policy generated, 0 on prompt,
retrieved-document and padding tokens. It may be bool, int or float.

Masked-out positions are removed with `torch.where`, not multiplied by zero: an
observation position may hold garbage (inf, nan, huge log-ratios) and `nan * 0`
is still nan, while `where` drops it from the value *and* from the gradient.
"""
from __future__ import annotations

import torch

from ragrl.errors import RagrlError


class AlgoInputError(RagrlError, ValueError):
    """Tensors handed to an advantage estimator or loss have the wrong shape or content."""


def check_same_shape(mask: torch.Tensor, **tensors: torch.Tensor) -> None:
    """Raise AlgoInputError naming the first tensor whose shape differs from `mask`'s."""
    for name, t in tensors.items():
        if t is not None and t.shape != mask.shape:
            raise AlgoInputError(
                f"{name} has shape {tuple(t.shape)} but the mask has shape {tuple(mask.shape)}")


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Sum of x over positions where mask is set. x, mask: same shape. dim=None → scalar."""
    kept = torch.where(mask.bool(), x, torch.zeros((), dtype=x.dtype, device=x.device))
    return kept.sum() if dim is None else kept.sum(dim)


def masked_count(mask: torch.Tensor, dim: int | None = None, dtype=torch.float32) -> torch.Tensor:
    """Number of set positions (as `dtype`), over everything or along `dim`."""
    m = mask.bool().to(dtype)
    return m.sum() if dim is None else m.sum(dim)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of x over set positions. An empty mask (or empty row) gives 0, not nan,
    because a batch whose sequences have no action tokens has nothing to learn from."""
    count = masked_count(mask, dim, dtype=x.dtype)
    return masked_sum(x, mask, dim) / count.clamp(min=1)


def masked_var(x: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of x over all set positions (scalar). With `unbiased`, Bessel's correction
    n/(n-1) is applied when n > 1; a single position has variance 0."""
    mean = masked_mean(x, mask)
    var = masked_mean((x - mean) ** 2, mask)
    if unbiased:
        n = masked_count(mask, dtype=x.dtype)
        var = torch.where(n > 1, var * n / (n - 1).clamp(min=1), var)
    return var


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True,
                  eps: float = 1e-8, reduce=None) -> torch.Tensor:
    """(x - mean) / std over set positions; zero where mask is 0.

    With shift_mean=False only the scale changes (the mean is added back), which
    keeps the sign of e.g. returns while normalising their size.
    x, mask: [B, T] (any shape works) → same shape.
    reduce: optional function summing a float64 tensor [count, sum, sum of squares] over
    processes (e.g. an all-reduce), so that N ranks whiten with the statistics of the whole
    batch, exactly as one process holding every row would.
    """
    if reduce is None:
        mean = masked_mean(x, mask)
        var = masked_var(x, mask, unbiased=True)
    else:
        m = mask.bool()
        xs = x.detach().double()[m]
        n, total, squares = reduce(torch.stack([xs.new_tensor(float(xs.numel())), xs.sum(), (xs * xs).sum()])).unbind()
        mean64 = total / n.clamp(min=1)
        var64 = ((squares - n * mean64 * mean64) / (n - 1).clamp(min=1)).clamp(min=0)
        mean, var = mean64.to(x.dtype), var64.to(x.dtype)
    whitened = (x - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        whitened = whitened + mean
    return torch.where(mask.bool(), whitened, torch.zeros((), dtype=x.dtype, device=x.device))
