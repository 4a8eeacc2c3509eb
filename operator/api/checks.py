"""One entry point that says everything wrong with a resource, as (field path, message) problems.

`validate` runs the schema and CEL-mirroring rules (pydantic) and then the checks only Python can make, because
they need knowledge the apiserver lacks, such as which patches apply to which SGLang version. The operator turns
the problems into an `Accepted=False` condition; an empty list means the spec is accepted.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from pydantic import ValidationError

from pdfleet.operator.api import names
from pdfleet.operator.api.base import RULE_ERROR
from pdfleet.operator.api.engine import Switch
from pdfleet.operator.api.spec import InferencePoolSpec
from pdfleet.runtime.patches import catalogue


@dataclasses.dataclass(frozen=True)
class Problem:
    """Something wrong with a spec: where (`spec.engine.patches[1]`) and why, in words a person can act on."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


def format_path(loc: Sequence[str | int]) -> str:
    """('spec', 'engine', 'extraArgs', 3) -> 'spec.engine.extraArgs[3]'."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def problems_from(error: ValidationError, prefix: Sequence[str | int] = ()) -> list[Problem]:
    """Pydantic errors as problems. A rule's error points at its object; its `field` names the culprit."""
    problems = []
    for item in error.errors(include_url=False):
        loc = [*prefix, *(part for part in item["loc"] if not _is_union_tag(part))]
        field = (item.get("ctx") or {}).get("field", "") if item["type"] == RULE_ERROR else ""
        path = format_path(loc) + field
        problems.append(Problem(path=path or "spec", message=item["msg"]))
    return problems


def _is_union_tag(part: str | int) -> bool:
    # pydantic adds the union member it tried (e.g. 'str', 'int', 'function-after[...]') to the location
    return isinstance(part, str) and (part in ("int", "str") or "[" in part)


def version_problems(spec: InferencePoolSpec) -> Iterator[Problem]:
    """Patches that do not apply to the pool's SGLang version, or that upstream has made redundant."""
    version = spec.engine.sglang_version
    for index, patch_id in enumerate(spec.engine.patches):
        patch = catalogue.BY_ID[patch_id]
        path = f"spec.engine.patches[{index}]"
        if patch.fixed_in is not None and catalogue.version_key(version) >= catalogue.version_key(patch.fixed_in):
            yield Problem(path, f"patch {patch_id} is fixed upstream in SGLang {patch.fixed_in}; "
                                f"sglangVersion {version} does not need it, remove it")
        elif version not in patch.applies_to:
            yield Problem(path, f"patch {patch_id} applies to SGLang {patch.applies_to}, "
                                f"not to sglangVersion {version}")


# --disable-tokenizer-batch-decode decodes request by request up to 0.5.6.post2 and is redundant from 0.5.8 on; in
# 0.5.7 (sglang#15155) a batch mixing options still takes the batch path with request 0's options, so the switch
# leaves the DSML leak it is meant to work around (tests/unit/test_dsml_batch_decode.py shows both).
BATCH_DECODE_SWITCH_INEFFECTIVE = catalogue.VersionRange(min="0.5.7", below="0.5.8")


def switch_problems(spec: InferencePoolSpec) -> Iterator[Problem]:
    """Switches that do not do what they promise on the pool's SGLang version."""
    version = spec.engine.sglang_version
    if spec.engine.tokenizer_batch_decode is Switch.DISABLED and version in BATCH_DECODE_SWITCH_INEFFECTIVE:
        yield Problem("spec.engine.tokenizerBatchDecode",
                      f"Disabled does not work on sglangVersion {version}: SGLang {BATCH_DECODE_SWITCH_INEFFECTIVE} "
                      "still decodes a batch of tool and plain requests with the first request's options, so "
                      "tool-call markup leaks into content; set it to Enabled and add patch dsml-batch-decode-guard "
                      "to spec.engine.patches, or upgrade to SGLang 0.5.8")


def runtime_problems(spec: InferencePoolSpec) -> Iterator[Problem]:
    """An SGLang release pdfleet's runtime does not instrument: its engines would refuse to start."""
    version = spec.engine.sglang_version
    if version not in catalogue.INSTRUMENTED:
        yield Problem("spec.engine.sglangVersion",
                      f"pdfleet's runtime instruments SGLang {', '.join(catalogue.INSTRUMENTED)} only (its rank-health "
                      f"seams are checked against each release's code): an engine of SGLang {version} would refuse "
                      "to start")


def validate_spec(raw_spec: Mapping[str, Any]) -> tuple[InferencePoolSpec | None, list[Problem]]:
    """The typed spec (None if it does not parse) and every problem found, schema and Python-only alike."""
    try:
        spec = InferencePoolSpec.model_validate(raw_spec)
    except ValidationError as error:
        return None, problems_from(error, prefix=("spec",))
    return spec, [*runtime_problems(spec), *version_problems(spec), *switch_problems(spec)]


def name_problems(name: str) -> list[Problem]:
    """A name the pool's objects could not be named after (the apiserver refuses it on create, by the same rules:
    this catches pools created before those rules were installed)."""
    return [Problem(names.PATH, message) for message in names.problems(name)]


def validate_pool(body: Mapping[str, Any]) -> tuple[InferencePoolSpec | None, list[Problem]]:
    """`validate_spec`, plus the problems of the pool's name (none for a body without one: a manifest to be
    created with `generateName`, say, whose name the apiserver picks and checks)."""
    spec, problems = validate_spec(body.get("spec") or {})
    name = (body.get("metadata") or {}).get("name")
    return spec, [*(name_problems(name) if name is not None else ()), *problems]


def validate(body: Mapping[str, Any]) -> list[Problem]:
    """Every problem with an InferencePool body (as kopf hands it over); [] when it is acceptable."""
    return validate_pool(body)[1]
