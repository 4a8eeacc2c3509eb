"""Holding a scale to `spec.scaling.ratio` (`planning.scale.ratio_band`), pure: Follow moves the other role as little as
it can, Clamp cuts the scale, a band no whole size fits refuses, and a pool is never left outside the band."""

from __future__ import annotations

import itertools

import pytest

from pdfleet.operator.api.roles import Role
from pdfleet.operator.api.scaling import OnScale, RatioBand, in_band
from pdfleet.operator.planning.scale import ratio_band

P, D = Role.PREFILL, Role.DECODE


def band(low: str, high: str, on_scale: OnScale = OnScale.FOLLOW) -> RatioBand:
    return RatioBand(min_decode_per_prefill=low, max_decode_per_prefill=high, on_scale=on_scale)


def test_no_band_or_a_scale_inside_it_changes_only_the_scaled_role() -> None:
    assert ratio_band.hold(None, {P: 1, D: 1}, {D: 9}).replicas == {P: 1, D: 9}
    held = ratio_band.hold(band("1", "4"), {P: 2, D: 2}, {D: 8})
    assert held.replicas == {P: 2, D: 8} and held.note is None and held.refusal is None


def test_follow_moves_the_other_role_to_the_nearest_size_in_the_band() -> None:
    held = ratio_band.hold(band("1", "2"), {P: 1, D: 2}, {D: 6})
    assert held.replicas == {P: 3, D: 6}
    assert held.note is not None and "prefill follows decode to 3" in held.note
    assert ratio_band.hold(band("1", "2"), {P: 4, D: 8}, {D: 2}).replicas == {P: 2, D: 2}
    assert ratio_band.hold(band("1", "2"), {P: 2, D: 3}, {P: 5}).replicas == {P: 5, D: 5}


def test_clamp_cuts_the_scale_beside_the_other_role() -> None:
    held = ratio_band.hold(band("1", "2", OnScale.CLAMP), {P: 2, D: 2}, {D: 7})
    assert held.replicas == {P: 2, D: 4}
    assert held.note is not None and "decode clamped to 4" in held.note
    assert ratio_band.hold(band("1", "2", OnScale.CLAMP), {P: 2, D: 4}, {P: 9}).replicas == {P: 4, D: 4}


def test_a_band_no_whole_size_fits_refuses_and_changes_nothing() -> None:
    held = ratio_band.hold(band("0.5", "0.5"), {P: 2, D: 1}, {D: 3})  # 3 decode needs 6 prefill exactly: fits
    assert held.replicas == {P: 6, D: 3}
    held = ratio_band.hold(band("0.5", "0.5", OnScale.CLAMP), {P: 3, D: 1}, {D: 2})  # beside 3 prefill: 1.5
    assert held.refusal is not None and held.replicas == {P: 3, D: 1}


@pytest.mark.parametrize("on_scale", list(OnScale))
@pytest.mark.parametrize(("low", "high"), [("0.5", "2"), ("1", "1"), ("0.25", "4"), ("1.5", "3")])
def test_whatever_is_scaled_the_result_is_inside_the_band_or_refused(on_scale: OnScale, low: str,
                                                                     high: str) -> None:
    ratio = band(low, high, on_scale)
    for prefill, decode, role, size in itertools.product(range(1, 7), range(1, 7), Role, range(1, 13)):
        if not in_band(ratio, prefill=prefill, decode=decode):
            continue
        held = ratio_band.hold(ratio, {P: prefill, D: decode}, {role: size})
        if held.refusal is None:
            assert in_band(ratio, prefill=held.replicas[P], decode=held.replicas[D]), (prefill, decode, role, size)
            if on_scale is OnScale.FOLLOW:
                assert held.replicas[role] == size  # the scale itself is taken whole
        else:
            assert held.replicas == {P: prefill, D: decode}
