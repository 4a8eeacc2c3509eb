"""The bf16 index-key cache layout the kernels read, as plain tensor operations: row `slot` is token slot `slot`.

SGLang keeps index keys in one uint8 buffer per layer, a page of 64 tokens per row. Stored as bf16 with no scale,
a page is 64 keys of D values back to back, so the buffer viewed as bf16 [-1, D] has one row per token slot and
`paged_logits` reads it as [pages, 64, D] directly. These are the writer, the token move and the ragged gather
the bf16-index-keys patch installs in SGLang.
"""

from __future__ import annotations

import torch


def bytes_per_token(dim: int) -> int:
    """Index-key bytes per token per layer in this layout (256 for D = 128)."""
    return dim * torch.bfloat16.itemsize


def key_rows(buffer: torch.Tensor, dim: int) -> torch.Tensor:
    """A bf16 index-key buffer (uint8, one page per row) as [slots, dim] bf16."""
    return buffer.view(torch.bfloat16).view(-1, dim)


def store_keys(buffer: torch.Tensor, slots: torch.Tensor, keys: torch.Tensor) -> None:
    key_rows(buffer, keys.shape[-1]).index_copy_(0, slots.view(-1).long(), keys.to(torch.bfloat16))


def move_keys(buffer: torch.Tensor, dim: int, target: torch.Tensor, source: torch.Tensor) -> None:
    rows = key_rows(buffer, dim)
    rows[target.view(-1).long()] = rows[source.view(-1).long()]


def token_slots(seq_lens: torch.Tensor, page_table: torch.Tensor, total: int, page_size: int) -> torch.Tensor:
    """The slots of every sequence's first seq_lens[b] tokens (`total` of them), sequences concatenated in batch
    order: the order SGLang's ragged gather returns keys in, which the per-token key ranges index into. Sized
    from `total` rather than from a mask, so no device-to-host read is needed."""
    seq_lens = seq_lens.to(page_table.device).long()
    sequence = torch.repeat_interleave(torch.arange(seq_lens.shape[0], device=page_table.device), seq_lens,
                                       output_size=total)
    first = torch.cumsum(seq_lens, 0) - seq_lens
    position = torch.arange(total, device=page_table.device) - first[sequence]
    return page_table[sequence, position // page_size].long() * page_size + position % page_size


def gather_keys(buffer: torch.Tensor, dim: int, seq_lens: torch.Tensor, page_table: torch.Tensor, total: int,
                page_size: int) -> torch.Tensor:
    """Every sequence's keys, concatenated in batch order ([total, dim] bf16)."""
    return key_rows(buffer, dim).index_select(0, token_slots(seq_lens, page_table, total, page_size))
