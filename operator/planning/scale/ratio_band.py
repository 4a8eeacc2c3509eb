"""Holding a scale of one role to `spec.scaling.ratio` (decode groups per prefill group). Pure.

The scaled role leads; the band either moves the other role into it (`Follow`, the other role's size changed as
little as it can) or cuts the scale to what the band allows beside the other role's size (`Clamp`). When both roles
were scaled at once, decode leads. A band no integer size fits (0.5 to 0.5 decode per prefill beside 3 prefill
groups) refuses the scale.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from fractions import Fraction

from pdfleet.operator.api.roles import Role
from pdfleet.operator.api.scaling import OnScale, RatioBand, in_band

MAX_REPLICAS = 1024  # spec.<role>.replicas' maximum


@dataclasses.dataclass(frozen=True)
class Held:
    replicas: Mapping[Role, int]  # both roles' sizes once the band is held
    note: str | None = None  # what the band changed, for the status and the Event
    refusal: str | None = None  # no size in the band fits: nothing is to change


def _range(low: Fraction, high: Fraction) -> tuple[int, int]:
    """Whole sizes from `low` to `high`, within the API's bounds (empty when first > last)."""
    return max(1, math.ceil(low)), min(MAX_REPLICAS, math.floor(high))


def _other_range(band: RatioBand, lead: Role, size: int) -> tuple[int, int]:
    """Sizes of the role other than `lead` that put `lead` at `size` inside the band."""
    if lead is Role.DECODE:
        return _range(size / band.high, size / band.low)
    return _range(band.low * size, band.high * size)


def hold(band: RatioBand | None, current: Mapping[Role, int], scaled: Mapping[Role, int]) -> Held:
    sizes = {**current, **scaled}
    if band is None or not scaled or in_band(band, prefill=sizes[Role.PREFILL], decode=sizes[Role.DECODE]):
        return Held(sizes)
    lead = Role.DECODE if Role.DECODE in scaled else Role.PREFILL
    other = Role.PREFILL if lead is Role.DECODE else Role.DECODE
    bounds = (f"scaling.ratio {band.min_decode_per_prefill} to {band.max_decode_per_prefill} decode per prefill "
              "group")
    if band.on_scale is OnScale.FOLLOW:
        first, last = _other_range(band, lead, sizes[lead])
        if first > last:
            return Held(current, refusal=f"no {other} size puts {lead} at {sizes[lead]} within {bounds}")
        follow = min(max(sizes[other], first), last)
        return Held({lead: sizes[lead], other: follow},
                    note=f"{other} follows {lead} to {follow} group(s) ({bounds})")
    first, last = _other_range(band, other, sizes[other])
    if first > last:
        return Held(current, refusal=f"no {lead} size fits beside {other} at {sizes[other]} within {bounds}")
    cut = min(max(sizes[lead], first), last)
    return Held({lead: cut, other: sizes[other]},
                note=f"{lead} clamped to {cut} group(s) beside {other} at {sizes[other]} ({bounds})")
