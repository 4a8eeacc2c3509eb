"""A deterministic stand-in tokenizer and "model": no downloads, same text in, same text out.

Prompt tokens are words and punctuation marks, each hashed into the vocabulary. The generated token number
`i` of a prompt is a hash of the prompt's tokens and `i`, spelled as a word from a small list, so a PD
request gives the same answer whichever engines serve it, and the first token (computed by the prefill)
agrees with what the decode side would have computed.
"""

from __future__ import annotations

import hashlib
import re

VOCAB_SIZE = 32000
_WORDS = ("the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "and", "then", "runs", "far",
          "away", "from", "simulated", "engine", "tokens", "flow", "through", "prefill", "decode", "again", "now")
_TOKEN = re.compile(r"\w+|[^\w\s]")


def _h(*parts: object) -> int:
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def encode(text: str) -> list[int]:
    return [_h(t) % VOCAB_SIZE for t in _TOKEN.findall(text)]


def prompt_key(input_ids: list[int]) -> int:
    return _h(*input_ids)


def output_token(key: int, index: int) -> int:
    return _h(key, index) % VOCAB_SIZE


def decode_token(token_id: int) -> str:
    return " " + _WORDS[token_id % len(_WORDS)]


def decode(token_ids: list[int]) -> str:
    return "".join(decode_token(t) for t in token_ids)


def chat_prompt(messages: list[dict[str, object]]) -> str:
    """A plain chat template: one `role: content` line per message, then the assistant's turn."""
    lines = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, list):  # OpenAI content parts: keep the text ones
            content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
        lines.append(f"{m.get('role', 'user')}: {content or ''}")
    return "\n".join([*lines, "assistant:"])
