"""Upgrading the operator rolls out no pool: the revisions of the examples' roles are pinned.

A role's revision is a hash of what shapes its engines; a pool whose stored revision differs from the one the
operator computes is rolled out, every group replaced. So a change that moves these values rolls out every pool
of every user on upgrade, whatever they changed: one that adds a field with a non-None default (fields added with a
default that renders the same pods go in render/revision.py's _ADDED_WITH_A_NEUTRAL_DEFAULT), or one that changes
what is hashed. If such a rollout is intended, change the pins and say so in the change's notes.

The pins were computed by the last released operator's code (be36a37) on these same examples; the current code
gives the same values.
"""

from __future__ import annotations

import pytest

from pdfleet.operator.api.roles import DEFAULT_DRAIN_SECONDS, Role
from pdfleet.operator.api.spec import InferencePoolSpec
from pdfleet.operator.render import revision
from tests.support.pools import example

PINS = {  # example -> (prefill, decode)
    "deepseek-v32-sm120": ("0d3945d08e", "870915d1f7"),
    "deepseek-v4-sm120": ("a014013499", "95d952e4d4"),
    "local-autoscaling": ("db185bb323", "1035fab63d"),
    "local-fleet": ("521e650fd5", "b79734f018"),
    "minimal": ("1347912cbc", "4c8459137f"),
    "multinode-decode": ("a07df501f9", "359306592a"),
}


@pytest.mark.parametrize("name", sorted(PINS))
def test_the_examples_revisions_are_those_the_released_operator_computed(name: str) -> None:
    spec = InferencePoolSpec.model_validate(example(name)["spec"])
    assert (revision.role_revision(spec, Role.PREFILL), revision.role_revision(spec, Role.DECODE)) == PINS[name], \
        "a changed revision rolls out every pool on upgrade: see this module's docstring"


def test_a_field_at_its_neutral_default_is_the_same_revision_set_or_not_and_another_value_is_not() -> None:
    body = example("local-fleet")["spec"]
    unset = InferencePoolSpec.model_validate(body)
    default = InferencePoolSpec.model_validate({**body, "decode": {**body["decode"],
                                                                   "drainSeconds": DEFAULT_DRAIN_SECONDS}})
    longer = InferencePoolSpec.model_validate({**body, "decode": {**body["decode"], "drainSeconds": 900}})
    assert revision.role_revision(default, Role.DECODE) == revision.role_revision(unset, Role.DECODE)
    assert revision.role_revision(longer, Role.DECODE) != revision.role_revision(unset, Role.DECODE)
    assert revision.role_revision(longer, Role.PREFILL) == revision.role_revision(unset, Role.PREFILL)
