"""Top-k selection over index logits, in SGLang's output form: int32 [rows, k], unused slots -1."""

from __future__ import annotations

import torch


def topk_indices(logits: torch.Tensor, k: int) -> torch.Tensor:
    """The positions of each row's k largest finite logits (order not significant), padded with -1.

    A row sees fewer than k positions when its context is shorter than k: masked (-inf) positions are never
    selected, so such a row ends in -1s, as SGLang's top-k transform expects.
    """
    rows, width = logits.shape
    out = torch.full((rows, k), -1, dtype=torch.int32, device=logits.device)
    take = min(k, width)
    if take == 0 or rows == 0:
        return out
    values, positions = torch.topk(logits, take, dim=1)
    out[:, :take] = torch.where(torch.isfinite(values), positions, -1).to(torch.int32)
    return out
