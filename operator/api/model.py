"""`spec.model`: what is served, where its weights come from, and how chat turns into tokens and back.

The chat encoding and the tool-call parser must describe the same markup. A DeepSeek-V4 prompt encoding with a
V3.2 parser (or the reverse) makes DSML tool-call markup leak into `content` instead of `tool_calls`, one of
the production failures pdfleet exists for; so a mismatch is refused at admission, not discovered under load.
"""

from __future__ import annotations

import enum
from typing import Annotated

from pydantic import Field

from pdfleet.operator.api.base import ApiModel, Rule
from pdfleet.operator.api.scalars import AbsolutePath, DnsSubdomain


class ChatEncoding(enum.StrEnum):
    """How chat messages become a prompt. `dsv32`/`dsv4` are SGLang's built-in DeepSeek encodings, used when
    no chat template is given; `template` uses the tokenizer's (or `chatTemplate`'s) Jinja template."""

    DSV32 = "dsv32"
    DSV4 = "dsv4"
    TEMPLATE = "template"


# The parser each DeepSeek encoding's markup needs, and the reverse.
PARSER_FOR_ENCODING = {ChatEncoding.DSV4: "deepseekv4", ChatEncoding.DSV32: "deepseekv32"}

ParserName = Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9_.-]*$", min_length=1, max_length=64)]


class PersistentVolumeClaimSource(ApiModel):
    """Weights on a PersistentVolumeClaim in the pool's namespace, mounted read-only."""

    claim_name: DnsSubdomain = Field(description="Name of the PersistentVolumeClaim.")
    sub_path: Annotated[str, Field(max_length=1024, pattern=r"^[^/]")] | None = Field(
        default=None, description="Folder inside the volume that holds the model (relative, no leading '/')."
    )


class HostPathSource(ApiModel):
    """Weights in a folder on every node that may run an engine (pre-staged local NVMe, say)."""

    path: AbsolutePath = Field(description="Absolute folder on the node that holds the model.")


def _count_set(*values: object) -> int:
    return sum(value is not None for value in values)


_EXACTLY_ONE_SOURCE = Rule(
    cel="(has(self.path) ? 1 : 0) + (has(self.pvc) ? 1 : 0) + (has(self.hostPath) ? 1 : 0) == 1",
    holds=lambda s: _count_set(s.path, s.pvc, s.host_path) == 1,
    message="model.source must set exactly one of path, pvc, hostPath",
)


class ModelSource(ApiModel):
    """Where the weights come from: exactly one of `path`, `pvc`, `hostPath`."""

    RULES = (_EXACTLY_ONE_SOURCE,)

    path: Annotated[str, Field(min_length=1, max_length=4096)] | None = Field(
        default=None,
        description="A path already present in the engine image, or a Hugging Face repo id SGLang downloads.",
    )
    pvc: PersistentVolumeClaimSource | None = Field(default=None, description="Weights on a PersistentVolumeClaim.")
    host_path: HostPathSource | None = Field(default=None, description="Weights in a folder on the node.")


def _rules_for_pairs() -> tuple[Rule, ...]:
    """Both directions of every encoding/parser pair. The encoding-side rules come first: Python reports the
    first broken rule of an object, and "dsv32 needs deepseekv32" is the more useful thing to hear."""
    needs_parser = tuple(
        Rule(
            cel=f"self.encoding != '{encoding}' || (has(self.toolCallParser) && self.toolCallParser == '{parser}')",
            holds=lambda m, e=encoding, p=parser: m.encoding != e or m.tool_call_parser == p,
            message=f"encoding {encoding} requires toolCallParser {parser}: other parsers leak its tool-call "
                    "markup into content",
            field=".toolCallParser",
        )
        for encoding, parser in PARSER_FOR_ENCODING.items()
    )
    needs_encoding = tuple(
        Rule(
            cel=f"!has(self.toolCallParser) || self.toolCallParser != '{parser}' || self.encoding == '{encoding}'",
            holds=lambda m, e=encoding, p=parser: m.tool_call_parser != p or m.encoding == e,
            message=f"toolCallParser {parser} requires encoding {encoding}: the prompt must use the markup "
                    "the parser expects",
            field=".encoding",
        )
        for encoding, parser in PARSER_FOR_ENCODING.items()
    )
    return needs_parser + needs_encoding


_TEMPLATE_ONLY_WITH_TEMPLATE_ENCODING = Rule(
    cel="!has(self.chatTemplate) || self.encoding == 'template'",
    holds=lambda m: m.chat_template is None or m.encoding == ChatEncoding.TEMPLATE,
    message="chatTemplate is only used with encoding template; dsv32 and dsv4 use SGLang's built-in encoding",
    field=".chatTemplate",
)


class ModelSpec(ApiModel):
    """The served model and its chat format."""

    RULES = (*_rules_for_pairs(), _TEMPLATE_ONLY_WITH_TEMPLATE_ENCODING)

    served_name: Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._/:-]*$")] = (
        Field(description="Model name clients send in requests (SGLang's --served-model-name).")
    )
    source: ModelSource = Field(description="Where the weights come from.")
    encoding: ChatEncoding = Field(
        default=ChatEncoding.TEMPLATE,
        description="Chat encoding: dsv32 or dsv4 (SGLang's DeepSeek encodings) or template (a Jinja template).",
    )
    tool_call_parser: ParserName | None = Field(
        default=None,
        description="SGLang tool-call parser (--tool-call-parser). dsv4 requires deepseekv4, dsv32 deepseekv32.",
    )
    reasoning_parser: ParserName | None = Field(
        default=None, description="SGLang reasoning parser (--reasoning-parser), e.g. deepseek-v3."
    )
    chat_template: Annotated[str, Field(min_length=1, max_length=4096)] | None = Field(
        default=None,
        description="Chat template file or name (--chat-template); only with encoding template.",
    )
    trust_remote_code: bool = Field(
        default=False, description="Allow the model's own Python code from its repository (--trust-remote-code)."
    )
