"""`spec.model`: what is served, where its weights come from, and how chat turns into tokens and back.

How chat messages become a prompt (the chat encoding) is not a field of its own: SGLang 0.5.23 has no flag for
it and derives it (`resolve_chat_encoding_spec`) from `--tool-call-parser` first (deepseekv41, deepseekv4,
deepseekv32 and kimi_k3 each select SGLang's built-in encoding of that name: dsv41, dsv4, dsv32, kimi_k3),
then from the model's architecture (DeepSeek-V4/V4.1 and Kimi-K3 models; a DeepSeek-V3 model without a chat
template gets dsv32), and otherwise renders the chat template (the tokenizer's, or `chatTemplate`). So
`toolCallParser` is the one knob: the encoding and the parser cannot disagree, and the DSML tool-call markup
that leaks into `content` when they do cannot be configured.

A `chatTemplate` next to a parser with a built-in encoding is refused at admission: SGLang then renders
prompts with the built-in encoding and never applies a Jinja template, and a named conversation template
would frame prompts differently from the markup the parser reads. The architecture-derived encodings cannot
be checked here (the operator does not read the model's config), so they are documented, not enforced.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from pdfleet.operator.api.base import ApiModel, Rule
from pdfleet.operator.api.scalars import AbsolutePath, DnsSubdomain

# The tool-call parsers for which SGLang renders prompts with its own encoding, and that encoding's name.
BUILT_IN_ENCODING_OF_PARSER = {
    "deepseekv41": "dsv41",
    "deepseekv4": "dsv4",
    "deepseekv32": "dsv32",
    "kimi_k3": "kimi_k3",
}

ParserName = Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9_.-]*$", min_length=1, max_length=64)]

class PersistentVolumeClaimSource(ApiModel):
    """Weights on a PersistentVolumeClaim in the pool's namespace, mounted read-only."""

    claim_name: DnsSubdomain = Field(description="Name of the PersistentVolumeClaim.")
    sub_path: Annotated[str, Field(max_length=1024, pattern=r"^[^/]")] | None = Field(
        default=None, description="Folder inside the volume that holds the model (relative, no leading '/')."
    )


_NO_BACKSTEPS = Rule(
    cel="!self.path.matches('(^|/)[.][.](/|$)')",
    holds=lambda s: ".." not in s.path.split("/"),
    message="hostPath.path may not contain '..': the pool policy allows host folders by prefix, and Kubernetes "
            "refuses such a hostPath in a pod",
    field=".path",
)


class HostPathSource(ApiModel):
    """Weights in a folder on every node that may run an engine (pre-staged local NVMe, say). The cluster's pool
    policy decides which folders a pool may use (none by default: docs/security.md)."""

    RULES = (_NO_BACKSTEPS,)

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


def _template_refused_with(parser: str, encoding: str) -> Rule:
    return Rule(
        cel=f"!has(self.chatTemplate) || !has(self.toolCallParser) || self.toolCallParser != '{parser}'",
        holds=lambda m: m.chat_template is None or m.tool_call_parser != parser,
        message=f"chatTemplate cannot be combined with toolCallParser {parser}: that parser selects SGLang's "
                f"built-in {encoding} chat encoding, which takes the template's place; set one of the two",
        field=".chatTemplate",
    )


class ModelSpec(ApiModel):
    """The served model and its chat format."""

    RULES = tuple(_template_refused_with(parser, encoding)
                  for parser, encoding in BUILT_IN_ENCODING_OF_PARSER.items())

    served_name: Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._/:-]*$")] = (
        Field(description="Model name clients send in requests (SGLang's --served-model-name).")
    )
    source: ModelSource = Field(description="Where the weights come from.")
    tool_call_parser: ParserName | None = Field(
        default=None,
        description="SGLang tool-call parser (--tool-call-parser). It also selects the chat encoding: deepseekv41, "
                    "deepseekv4, deepseekv32 and kimi_k3 use SGLang's built-in encoding (dsv41, dsv4, dsv32, "
                    "kimi_k3); with any other, the model's architecture or chat template decides.",
    )
    reasoning_parser: ParserName | None = Field(
        default=None, description="SGLang reasoning parser (--reasoning-parser), e.g. deepseek-v3."
    )
    chat_template: Annotated[str, Field(min_length=1, max_length=4096)] | None = Field(
        default=None,
        description="Chat template file or name (--chat-template); not with a toolCallParser that has a built-in "
                    "encoding (deepseekv41, deepseekv4, deepseekv32, kimi_k3).",
    )
    trust_remote_code: bool = Field(
        default=False, description="Allow the model's own Python code from its repository (--trust-remote-code)."
    )
