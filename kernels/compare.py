"""How close two logit tensors, or two top-k selections, are: the measures the kernels are accepted by."""

from __future__ import annotations

import torch


def calc_diff(x: torch.Tensor, y: torch.Tensor) -> float:
    """1 - 2 * sum(x * y) / sum(x^2 + y^2) over positions finite in both (DeepGEMM's measure): 0 when equal."""
    both = torch.isfinite(x) & torch.isfinite(y)
    x, y = x[both].double(), y[both].double()
    denominator = (x * x + y * y).sum()
    return 0.0 if denominator == 0 else float(1 - 2 * (x * y).sum() / denominator)


def same_masks(x: torch.Tensor, y: torch.Tensor) -> bool:
    """Both tensors have -inf at exactly the same positions."""
    return bool(torch.equal(torch.isneginf(x), torch.isneginf(y)))


def topk_recall(selected: torch.Tensor, reference: torch.Tensor, k: int, atol: float = 1e-4) -> float:
    """The fraction of the reference's top-k slots that `selected` fills with a position as good, ties accepted.

    A selected position counts when its reference logit is finite and at least the row's k-th best reference
    logit minus `atol`; each row contributes min(k, its finite positions) slots.
    """
    take = min(k, reference.shape[1])
    kth = torch.topk(reference, take, dim=1).values[:, -1:] if take else reference[:, :0]
    valid = selected >= 0
    picked = torch.gather(reference, 1, selected.clamp(min=0).long())
    good = valid & torch.isfinite(picked) & (picked >= kth - atol)
    wanted = torch.isfinite(reference).sum(dim=1).clamp(max=take)
    total = int(wanted.sum())
    return 1.0 if total == 0 else float(good.sum(dim=1).clamp(max=wanted).sum()) / total
