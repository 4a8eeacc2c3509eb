"""The KV layout hash changes exactly when prefill and decode engines could no longer exchange KV caches."""

from __future__ import annotations

from typing import Any

import pytest

from pdfleet.operator.api.spec import InferencePoolSpec
from pdfleet.operator.render.layout import kv_layout
from pdfleet.runtime.patches import catalogue
from tests.support.pools import pool_body


def spec_of(**updates: Any) -> InferencePoolSpec:
    return InferencePoolSpec.model_validate(pool_body(**updates)["spec"])


@pytest.mark.parametrize(("change", "changes_layout"), [
    ({"engine__extraArgs": ["--page-size", "64"]}, True),
    ({"engine__extraArgs": ["--kv-cache-dtype=fp8_e4m3"]}, True),
    ({"engine__extraArgs": ["--attention-backend", "flashinfer"]}, True),
    # SGLang's parser takes an unambiguous prefix as the flag: so does the layout.
    ({"engine__extraArgs": ["--page-siz", "64"]}, True),
    ({"engine__extraArgs": ["--kv-cache-dt=fp8_e4m3"]}, True),
    ({"engine__patches": ["kv-poll-lockstep"]}, False),
    ({"engine__overlapSchedule": "Disabled"}, False),
    ({"engine__extraArgs": ["--mem-fraction-static", "0.8"]}, False),
    ({"decode__replicas": 4}, False),
])
def test_only_what_shapes_kv_pages_changes_the_layout(change: dict, changes_layout: bool) -> None:
    assert (kv_layout(spec_of()) != kv_layout(spec_of(**change))) is changes_layout


def test_a_patch_that_changes_the_kv_layout_changes_it() -> None:
    assert catalogue.BY_ID["bf16-index-keys"].kv_layout
    assert kv_layout(spec_of()) != kv_layout(spec_of(engine__patches=["bf16-index-keys"]))


def test_an_abbreviated_layout_flag_is_the_same_layout_as_the_flag_written_out() -> None:
    assert kv_layout(spec_of(engine__extraArgs=["--page-siz", "64"])) == \
        kv_layout(spec_of(engine__extraArgs=["--page-size=64"]))
