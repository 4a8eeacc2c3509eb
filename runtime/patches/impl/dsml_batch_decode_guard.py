"""dsml-batch-decode-guard: the detokenizer decodes each request with its own special-token options.

Why. Before 0.5.8, `DetokenizerManager._decode_batch_token_id_output` decodes a whole batch with one call to
`tokenizer.batch_decode(..., skip_special_tokens=recv_obj.skip_special_tokens[0], ...)`. SGLang's chat serving
asks for `skip_special_tokens=False` only on requests with tools (and `tool_choice` not "none"), so a tool
request batched behind a plain one has its special tokens, DeepSeek's `｜DSML｜` markers among them, dropped: the
tool-call parser then sees plain `<invoke ...>` text and hands it back as `content`. 0.5.7 (sglang#15155) only
stops `--disable-tokenizer-batch-decode` from helping: with the switch on, a mixed batch still takes the batch
path with request 0's options. 0.5.8 (sglang#16698, `_grouped_batch_decode`) groups the batch by options.

What this patch does. `handle_batch_token_id_out` runs SGLang's own code unchanged, with `self.tokenizer`
replaced for the duration of the call by a view (`GroupedDecoder`) that knows the batch's per-request options.
A `batch_decode` over the whole batch is split into one call per distinct (skip_special_tokens,
spaces_between_special_tokens) pair, each with that pair's options, and the texts are put back in request order,
so SGLang's incremental offsets (`surr_offset`, `read_offset`, `sent_offset`) see exactly what a per-request
decode would give them. Anything else the code asks of the tokenizer goes to the real one. The view is the
smallest change that reaches both decode calls (surrounding and read text) without copying SGLang's
incremental-decoding code, which changed in every release of the range.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

PATCH_ID = "dsml-batch-decode-guard"
HANDLE_BATCH_TOKEN_ID_OUT = "sglang.srt.managers.detokenizer_manager.DetokenizerManager.handle_batch_token_id_out"
TARGETS = (HANDLE_BATCH_TOKEN_ID_OUT,)
# The detokenizer's module imports the scheduler's (through the tokenizer manager) before it defines
# DetokenizerManager, so this patch is applied once the module itself is imported (see engine_setup).
APPLY_AFTER_IMPORT_OF = "sglang.srt.managers.detokenizer_manager"

# Each release was checked by running its real detokenizer (tests/unit/test_dsml_batch_decode.py): markers lost
# without the patch, kept with it. Its `_decode_batch_token_id_output` calls `tokenizer.batch_decode` on the
# whole batch with request 0's options (or `tokenizer.decode` per request), which is what the view relies on.
FINGERPRINTS: Mapping[str, Mapping[str, str]] = {
    "0.5.6.post2": {HANDLE_BATCH_TOKEN_ID_OUT: "d439356b99ebc228"},
    "0.5.7": {HANDLE_BATCH_TOKEN_ID_OUT: "91d4cf65a6dcdc4a"},
}

Options = tuple[bool, bool]  # (skip_special_tokens, spaces_between_special_tokens)


def group_by_options(options: Sequence[Options]) -> dict[Options, list[int]]:
    """Batch positions per distinct options, groups in order of first appearance, positions in batch order."""
    groups: dict[Options, list[int]] = {}
    for index, option in enumerate(options):
        groups.setdefault(option, []).append(index)
    return groups


class GroupedDecoder:
    """The detokenizer's tokenizer, as seen while it decodes one batch whose per-request options are known."""

    def __init__(self, tokenizer: Any, options: Sequence[Options]) -> None:
        self._tokenizer = tokenizer
        self._options = list(options)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tokenizer, name)

    def __len__(self) -> int:
        return len(self._tokenizer)

    def batch_decode(self, sequences: Sequence[Sequence[int]], *args: Any, **kwargs: Any) -> list[str]:
        if len(sequences) != len(self._options):
            # Not the per-request decode of this batch: nothing to regroup, so the caller's options stand.
            return list(self._tokenizer.batch_decode(sequences, *args, **kwargs))
        kwargs.pop("skip_special_tokens", None)
        kwargs.pop("spaces_between_special_tokens", None)
        texts: list[str] = [""] * len(sequences)
        for (skip, spaces), positions in group_by_options(self._options).items():
            decoded = self._tokenizer.batch_decode(
                [sequences[i] for i in positions], *args,
                skip_special_tokens=skip, spaces_between_special_tokens=spaces, **kwargs,
            )
            for position, text in zip(positions, decoded, strict=True):
                texts[position] = text
        return texts


def guard(original: Callable[..., Any]) -> Callable[..., Any]:
    """`handle_batch_token_id_out` with the tokenizer seen through a `GroupedDecoder` for the batch."""

    @functools.wraps(original)
    def handle_batch_token_id_out(self: Any, recv_obj: Any) -> Any:
        tokenizer = self.tokenizer
        if tokenizer is None or isinstance(tokenizer, GroupedDecoder):
            return original(self, recv_obj)
        options = list(zip(recv_obj.skip_special_tokens, recv_obj.spaces_between_special_tokens, strict=True))
        self.tokenizer = GroupedDecoder(tokenizer, options)
        try:
            return original(self, recv_obj)
        finally:
            self.tokenizer = tokenizer

    return handle_batch_token_id_out


def replacements(originals: Mapping[str, Callable[..., Any]]) -> dict[str, Callable[..., Any]]:
    return {HANDLE_BATCH_TOKEN_ID_OUT: guard(originals[HANDLE_BATCH_TOKEN_ID_OUT])}
