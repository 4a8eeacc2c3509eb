"""The planner's render cache (`planning.renders`) and the revision memo: a plan made with them is the plan made
without them, whatever changed in between: a new generation, a spec edited in place, another status, other
observed pods, another router key."""

from __future__ import annotations

import copy
import datetime
import gc
from typing import Any

import pytest

from pdfleet.operator.api import checks
from pdfleet.operator.api.roles import Role
from pdfleet.operator.cache import Observed
from pdfleet.operator.planning import reconcile
from pdfleet.operator.planning.plan import Plan
from pdfleet.operator.planning.renders import Renders
from pdfleet.operator.render import revision
from tests.support.pools import pool_body
from tests.unit.test_planning import NOW, FakeCluster

Body = dict[str, Any]


def image_of(plan: Plan) -> set[str]:
    return {c["image"] for o in plan.apply if o["kind"] == "Pod" for c in o["spec"]["containers"]}


def test_a_plan_with_the_cache_is_the_plan_without_it_through_a_pools_life() -> None:
    """Walks a pool from creation to Ready, then a spec change rolled out, planning every step both ways."""
    renders = Renders()
    cluster = FakeCluster(pool_body(prefill=2, decode=2))
    for step in range(12):
        health, engines = cluster.answers()
        observed = cluster.observed()
        cached = reconcile.plan(cluster.pool, observed, now=NOW, health=health, engines=engines, renders=renders)
        fresh = reconcile.plan(cluster.pool, observed, now=NOW, health=health, engines=engines)
        assert cached == fresh
        cluster.apply(fresh)
        if step == 5:
            assert fresh.empty, "converged"
            cluster.pool["spec"]["engine"]["image"] = "lmsysorg/sglang:v0.5.23-post1"
            cluster.pool["metadata"]["generation"] += 1
    assert renders.counts.desired_hits > 0 and renders.counts.status_hits > 0 and renders.counts.spec_hits > 0


def test_a_new_generation_renders_again() -> None:
    renders = Renders()
    pool = pool_body(prefill=1, decode=1)
    empty = Observed(pool=pool, owned={})
    first = reconcile.plan(pool, empty, now=NOW, renders=renders)
    changed = copy.deepcopy(pool)
    changed["spec"]["engine"]["image"] = "example.com/sglang:other"
    changed["metadata"]["generation"] = 2
    second = reconcile.plan(changed, Observed(pool=changed, owned={}), now=NOW, renders=renders)
    assert image_of(first) == {"lmsysorg/sglang:v0.5.23"}
    assert image_of(second) == {"example.com/sglang:other"}, "served the previous generation's render"
    assert renders.counts.spec_misses == 2
    bumped = copy.deepcopy(changed)
    bumped["metadata"]["generation"] = 3  # the same spec under a new generation is validated again too
    reconcile.plan(bumped, Observed(pool=bumped, owned={}), now=NOW, renders=renders)
    assert renders.counts.spec_misses == 3


def test_a_spec_edited_without_a_new_generation_is_never_served_stale() -> None:
    """The generation is not trusted alone: a spec edited in place (as tests and a stale cache may) renders
    again, because the cache compares the spec it was made from."""
    renders = Renders()
    pool = pool_body(prefill=1, decode=1)
    reconcile.plan(pool, Observed(pool=pool, owned={}), now=NOW, renders=renders)
    pool["spec"]["engine"]["image"] = "example.com/sglang:edited"  # same dict, same generation
    plan = reconcile.plan(pool, Observed(pool=pool, owned={}), now=NOW, renders=renders)
    assert image_of(plan) == {"example.com/sglang:edited"}


def test_a_changed_status_is_parsed_again() -> None:
    """The previous status decides what changed: a cache that served the old one would write nothing (or the
    wrong thing). Here the status is replaced under the same spec: the plan must put it back."""
    renders = Renders()
    cluster = FakeCluster(pool_body(prefill=1, decode=1))
    cluster.converge()
    assert reconcile.plan(cluster.pool, cluster.observed(), now=NOW, health=cluster.answers()[0],
                          engines=cluster.answers()[1], renders=renders).empty
    good = copy.deepcopy(cluster.pool["status"])
    cluster.pool["status"]["phase"] = "Degraded"  # someone else wrote the status
    plan = reconcile.plan(cluster.pool, cluster.observed(), now=NOW, health=cluster.answers()[0],
                          engines=cluster.answers()[1], renders=renders)
    assert plan.status is not None and plan.status["phase"] == "Ready"
    assert plan.status == good
    assert renders.counts.status_misses == 2


def test_other_observed_pods_change_the_render_through_the_surge_slots_only() -> None:
    """A changed observed object is planned from afresh: pods are classified every time; the render is reused
    only for the same surge slots, which the observed pods decide."""
    renders = Renders()
    cluster = FakeCluster(pool_body(prefill=1, decode=1))
    cluster.converge()
    health, engines = cluster.answers()
    assert reconcile.plan(cluster.pool, cluster.observed(), now=NOW, health=health, engines=engines,
                          renders=renders).empty
    del cluster.owned[("Pod", "tiny-decode-0-0")]  # the pod went: the cache must not hide it
    plan = reconcile.plan(cluster.pool, cluster.observed(), now=NOW, health=health, engines=engines,
                          renders=renders)
    assert [o["metadata"]["name"] for o in plan.apply if o["kind"] == "Pod"] == ["tiny-decode-0-0"]
    leftover = copy.deepcopy(cluster.owned[("Pod", "tiny-prefill-0-0")])
    leftover["metadata"]["name"] = "tiny-prefill-3-0"
    leftover["metadata"]["labels"]["pdfleet.dev/group"] = "tiny-prefill-3"
    cluster.owned[("Pod", "tiny-prefill-3-0")] = leftover
    observed = cluster.observed()
    assert reconcile.plan(cluster.pool, observed, now=NOW, health=health, engines=engines, renders=renders) == \
        reconcile.plan(cluster.pool, observed, now=NOW, health=health, engines=engines)


def test_another_router_key_or_uid_is_another_render() -> None:
    renders = Renders()
    pool = pool_body(prefill=1, decode=1)
    observed = Observed(pool=pool, owned={})

    def router_env(plan: Plan) -> str:
        deployment = next(o for o in plan.apply if o["kind"] == "Deployment")
        return str(deployment["spec"]["template"])

    one = reconcile.plan(pool, observed, now=NOW, router_key="key-1", renders=renders)
    two = reconcile.plan(pool, observed, now=NOW, router_key="key-2", renders=renders)
    assert "key-2" in router_env(two) and "key-2" not in router_env(one)
    other = copy.deepcopy(pool)
    other["metadata"]["uid"] = "uid-2"  # the pool deleted and created again under its name
    plan = reconcile.plan(other, Observed(pool=other, owned={}), now=NOW, renders=renders)
    assert {r["uid"] for o in plan.apply for r in o["metadata"]["ownerReferences"]} == {"uid-2"}


def test_forget_drops_the_pool() -> None:
    renders = Renders()
    pool = pool_body()
    reconcile.plan(pool, Observed(pool=pool, owned={}), now=NOW, renders=renders)
    assert len(renders) == 1
    renders.forget("ns", "tiny")
    assert len(renders) == 0


def test_the_revision_memo_follows_the_spec_object_not_its_address() -> None:
    """Revisions are kept by the spec object's identity; a different spec (even one built in the same place
    after the first is gone) gets its own."""
    one, _ = checks.validate_pool(pool_body())
    changed = pool_body()
    changed["spec"]["engine"]["image"] = "example.com/sglang:other"
    two, _ = checks.validate_pool(changed)
    assert one is not None and two is not None
    assert revision.pool_revision(one) == revision.pool_revision(one)
    assert revision.pool_revision(one) != revision.pool_revision(two)
    assert revision.role_revision(two, Role.DECODE) == revision._role_revision(two, Role.DECODE)
    # Other tests' specs may still be waiting for the collector: count only what this test adds.
    gc.collect()
    kept = set(revision._memo)
    for _ in range(40):  # specs validated for one use each leave nothing behind
        spec, _ = checks.validate_pool(pool_body())
        assert spec is not None
        revision.pool_revision(spec)
        assert id(spec) in revision._memo
    del spec
    gc.collect()
    assert set(revision._memo) <= kept
    assert id(one) in revision._memo and id(two) in revision._memo
    assert revision.pool_revision(two) == revision._digest([revision._role_revision(two, r) for r in Role])


def test_the_revisions_of_many_pools_planned_in_turn_are_computed_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each pool's spec lives in the render cache for its generation; a resync plans every pool in turn, and a
    health poll follows each. An LRU of 32 specs recomputed every revision of every plan once there were more pools
    than that (the benchmark's 100)."""
    specs = []
    for n in range(100):
        body = pool_body(name=f"p{n}")
        body["spec"]["engine"]["image"] = f"example.com/sglang:{n}"
        spec, _ = checks.validate_pool(body)
        assert spec is not None
        specs.append(spec)
    computed: list[Role] = []
    compute = revision._role_revision

    def counted(spec: Any, role: Role) -> str:
        computed.append(role)
        return compute(spec, role)

    monkeypatch.setattr(revision, "_role_revision", counted)
    first = [revision.pool_revision(spec) for spec in specs]
    assert len(computed) == 2 * len(specs) and len(set(first)) == len(specs)
    for _ in range(3):
        assert [revision.pool_revision(spec) for spec in specs] == first
        assert [revision.role_revision(spec, Role.DECODE) for spec in specs] == \
            [compute(spec, Role.DECODE) for spec in specs]
    assert len(computed) == 2 * len(specs), "a revision of a live spec was computed again"


def test_a_cached_plan_costs_a_fraction_of_a_fresh_one() -> None:
    """Not a benchmark: the cache must be used at all on a steady pool of 8 groups (no render, no parse)."""
    renders = Renders()
    cluster = FakeCluster(pool_body(prefill=4, decode=4))
    cluster.converge()
    health, engines = cluster.answers()
    for _ in range(3):
        assert reconcile.plan(cluster.pool, cluster.observed(), now=NOW + datetime.timedelta(seconds=1),
                              health=health, engines=engines, renders=renders).empty
    assert (renders.counts.spec_misses, renders.counts.desired_misses, renders.counts.status_misses) == (1, 1, 1)
