"""Patch ids, as an enum generated from the runtime's patch catalogue (`pdfleet.runtime.patches.catalogue`).

The catalogue is the one list of patches; the CRD's enum is regenerated from it, and the stale-CRD test fails
when they drift apart. A catalogue entry pdfleet does not implement yet is refused at admission with its reason,
by the apiserver (CEL) and by the operator alike.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, Field
from pydantic_core import PydanticCustomError

from pdfleet.runtime.patches import catalogue

PATCH_IDS: tuple[str, ...] = tuple(sorted(catalogue.IDS))


def _unavailable_message(reason: str) -> str:
    return f"is not implemented by pdfleet yet: {reason}"


def _known(patch_id: str) -> str:
    if patch_id not in catalogue.BY_ID:
        raise PydanticCustomError(
            "enum", "unknown patch {patch}; known patches: {known}",
            {"patch": patch_id, "known": ", ".join(PATCH_IDS)},
        )
    reason = catalogue.UNAVAILABLE.get(patch_id)
    if reason is not None:
        raise PydanticCustomError("unavailable", "patch {patch} {why}",
                                  {"patch": patch_id, "why": _unavailable_message(reason)})
    return patch_id


def _cel_string(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _available_rule() -> list[dict[str, str]]:
    ids = "[" + ", ".join(_cel_string(pid) for pid in sorted(catalogue.UNAVAILABLE)) + "]"
    reasons = "{" + ", ".join(f"{_cel_string(pid)}: {_cel_string(_unavailable_message(why))}"
                              for pid, why in sorted(catalogue.UNAVAILABLE.items())) + "}"
    return [{
        "rule": f"!(self in {ids})",
        "message": "this patch is in the catalogue but pdfleet does not implement it yet",
        "messageExpression": f"'patch ' + self + ' ' + {reasons}[self]",
    }]


PatchId = Annotated[
    str,
    Field(max_length=63, json_schema_extra={"enum": list(PATCH_IDS)} |
          ({"x-kubernetes-validations": _available_rule()} if catalogue.UNAVAILABLE else {})),
    AfterValidator(_known),
]
