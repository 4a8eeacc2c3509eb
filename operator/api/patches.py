"""Patch ids, as an enum generated from the runtime's patch catalogue (`pdfleet.runtime.patches.catalogue`).

The catalogue is the one list of patches; the CRD's enum is regenerated from it, and the stale-CRD test fails
when they drift apart.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, Field
from pydantic_core import PydanticCustomError

from pdfleet.runtime.patches import catalogue

PATCH_IDS: tuple[str, ...] = tuple(sorted(catalogue.IDS))


def _known(patch_id: str) -> str:
    if patch_id not in catalogue.BY_ID:
        raise PydanticCustomError(
            "enum", "unknown patch {patch}; known patches: {known}",
            {"patch": patch_id, "known": ", ".join(PATCH_IDS)},
        )
    return patch_id


PatchId = Annotated[
    str,
    Field(max_length=63, json_schema_extra={"enum": list(PATCH_IDS)}),
    AfterValidator(_known),
]
