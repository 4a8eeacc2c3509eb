"""`spec.scaling`: how the two roles' sizes are held together when either one is scaled.

A PD pool serves well only while its prefill and decode capacity fit its traffic: too few decode groups for the
prefill groups feeding them and KV transfers queue; too many and GPUs idle. `ratio` bounds decode groups per
prefill group. A person's edit of the replicas is checked against it at admission; a scale through an
InferencePoolRole (kubectl scale, an HPA, KEDA) is held to it by the operator (`planning.scale.ratio_band`), which moves
the other role with it (`Follow`) or cuts the scale to the band (`Clamp`), and says which.
"""

from __future__ import annotations

import enum
from fractions import Fraction
from typing import Annotated

from pydantic import Field

from pdfleet.operator.api.base import ApiModel, Rule

# A decimal with at most two places: "0.5", "2", "1.25". Strings, because Kubernetes APIs carry no floats.
RATIO_PATTERN = r"^(0|[1-9][0-9]{0,3})(\.[0-9]{1,2})?$"
Ratio = Annotated[str, Field(pattern=RATIO_PATTERN, max_length=7)]


class OnScale(enum.StrEnum):
    FOLLOW = "Follow"  # the other role moves into the band with the scaled one
    CLAMP = "Clamp"  # the scaled role is cut to what the band allows beside the other role's size


def fraction(text: str) -> Fraction:
    return Fraction(text)


def hundredths_cel(field: str) -> str:
    """A ratio as whole hundredths in CEL, where a double compared with a product of doubles could miss by one ulp
    (0.3 * 10 > 3): the rounding is exact for two decimal places."""
    return f"int(double({field}) * 100.0 + 0.5)"


def in_band(band: RatioBand, *, prefill: int, decode: int) -> bool:
    return band.low * prefill <= decode <= band.high * prefill


_MIN_IS_POSITIVE = Rule(
    cel="double(self.minDecodePerPrefill) > 0.0",
    holds=lambda r: fraction(r.min_decode_per_prefill) > 0,
    message="minDecodePerPrefill must be above 0",
    field=".minDecodePerPrefill",
)
_MIN_BELOW_MAX = Rule(
    cel="double(self.minDecodePerPrefill) <= double(self.maxDecodePerPrefill)",
    holds=lambda r: fraction(r.min_decode_per_prefill) <= fraction(r.max_decode_per_prefill),
    message="minDecodePerPrefill must not exceed maxDecodePerPrefill",
    field=".maxDecodePerPrefill",
)


class RatioBand(ApiModel):
    """Decode groups per prefill group, kept between two bounds."""

    RULES = (_MIN_IS_POSITIVE, _MIN_BELOW_MAX)

    min_decode_per_prefill: Ratio = Field(description="Fewest decode groups per prefill group, e.g. \"0.5\".")
    max_decode_per_prefill: Ratio = Field(description="Most decode groups per prefill group, e.g. \"4\".")
    on_scale: OnScale = Field(
        default=OnScale.FOLLOW,
        description="What a scale of one role through its InferencePoolRole that would leave the band does: "
                    "Follow moves the other role into the band with it, Clamp cuts the scale to the band.",
    )

    @property
    def low(self) -> Fraction:
        return fraction(self.min_decode_per_prefill)

    @property
    def high(self) -> Fraction:
        return fraction(self.max_decode_per_prefill)


class ScalingSpec(ApiModel):
    """How the roles' sizes relate."""

    ratio: RatioBand | None = Field(
        default=None, description="Bounds on decode groups per prefill group; none by default.")
