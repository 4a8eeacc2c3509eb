"""The planner, walked through a pool's life without a cluster: create, become ready, resync, scale,
roll out, restart a failed group, reject a bad spec."""

from __future__ import annotations

import copy
import dataclasses
import datetime
from typing import Any

import pytest

from pdfleet.operator.api.pool_policy import PoolPolicy
from pdfleet.operator.cache import Observed
from pdfleet.operator.planning import reconcile, spec_change
from pdfleet.operator.planning.groups import Expectations
from pdfleet.operator.planning.plan import Plan
from pdfleet.operator.planning.router.router_breakers import RouterView
from pdfleet.operator.render import labels
from pdfleet.operator.render.context import Settings
from tests.support import verified_engines
from tests.support.pools import NO_BAKE, pool_body

NOW = datetime.datetime(2026, 11, 30, 12, 0, tzinfo=datetime.UTC)
Body = dict[str, Any]


class FakeCluster:
    """Applies plans the way the apiserver, kwok and the controllers would, instantly: pods become Ready,
    deletions complete, status is stored. Enough to walk the planner through a whole life."""

    # The examples' multi-node pools load their model from a host folder, which a cluster's admin must allow
    # (api/pool_policy.py): this cluster's admin does; tests/unit/test_pool_policy.py is about the policy.
    SETTINGS = Settings(policy=PoolPolicy(host_path_prefixes=("/mnt/nvme/models",)))

    def __init__(self, pool: Body, *, engines: bool = True) -> None:
        self.pool = pool
        self.owned: dict[tuple[str, str], Body] = {}
        self.writes = 0
        self.engines = engines  # Ready engines answer the verification gates as rendered
        self.loops: dict[str, str] = {}  # group -> the loop its ranks report instead
        self.server_args: dict[str, Body] = {}  # group -> /server_info fields its leader reports instead
        self.gang_reasons: dict[str, str] = {}  # Kueue group -> why Kueue holds it, as kube/kueue.py reads it
        self.routers: dict[str, RouterView] = {}  # what each router pod can route to, as membership read it

    def observed(self) -> Observed:
        pods = tuple({"metadata": {"name": name, "uid": f"uid-{name}"}, "status": {"phase": "Running"}}
                     for name in self.routers)
        return Observed(pool=copy.deepcopy(self.pool), owned=copy.deepcopy(self.owned), routers=pods)

    def apply(self, plan: Plan) -> None:
        for obj in plan.apply:
            self.writes += 1
            obj = copy.deepcopy(obj)
            obj["metadata"]["uid"] = f"uid-{obj['metadata']['name']}"
            if obj["kind"] == "Pod":
                obj["status"] = {"phase": "Running", "conditions": [
                    {"type": "Ready", "status": "True", "lastTransitionTime": NOW.strftime("%Y-%m-%dT%H:%M:%SZ")}]}
            if obj["kind"] == "Deployment":
                obj["status"] = {"availableReplicas": obj["spec"]["replicas"]}
            self.owned[(obj["kind"], obj["metadata"]["name"])] = obj
        for ref in plan.delete:
            self.writes += 1
            self.owned.pop((ref.kind, ref.name), None)
        if plan.status is not None:
            self.writes += 1
            self.pool["status"] = plan.status
        for change in plan.pool_changes:  # after the status, as the executor sends them
            self.writes += 1
            try:
                changed = spec_change.apply(self.pool, change)
            except ValueError:
                continue  # the apiserver refuses a patch whose generation test fails
            if changed["spec"] != self.pool["spec"]:
                changed["metadata"]["generation"] = changed["metadata"].get("generation", 0) + 1
            self.pool = changed

    def answers(self) -> tuple[dict[str, Any], dict[str, Any]]:
        if not self.engines:
            return {}, {}
        pods = [o for (kind, _), o in self.owned.items() if kind == "Pod"]
        return verified_engines.answers(self.pool, pods, loops=self.loops, server_args=self.server_args)

    def step(self, now: datetime.datetime = NOW) -> Plan:
        health, engines = self.answers()
        plan = reconcile.plan(self.pool, self.observed(), now=now, health=health, engines=engines,
                              gang_reasons=self.gang_reasons, routers=self.routers, settings=self.SETTINGS)
        self.apply(plan)
        return plan

    def converge(self, limit: int = 10) -> list[Plan]:
        plans = []
        for _ in range(limit):
            plan = self.step()
            plans.append(plan)
            if plan.empty:
                return plans
        raise AssertionError(f"no convergence in {limit} steps: {plans[-1]}")

    def pods(self) -> list[str]:
        return sorted(name for kind, name in self.owned if kind == "Pod")


def reasons(plans: list[Plan]) -> list[str]:
    return [e.reason for p in plans for e in p.events]


@pytest.mark.effect("spec.*.replicas")
def test_a_new_pool_gets_its_groups_and_router_and_becomes_ready() -> None:
    cluster = FakeCluster(pool_body(prefill=1, decode=2))
    plans = cluster.converge()
    assert cluster.pods() == ["tiny-decode-0-0", "tiny-decode-1-0", "tiny-prefill-0-0"]
    kinds = sorted({k for k, _ in cluster.owned})
    assert kinds == ["Deployment", "NetworkPolicy", "Pod", "PodDisruptionBudget", "Role", "RoleBinding", "Service",
                     "ServiceAccount"]
    status = cluster.pool["status"]
    assert status["phase"] == "Ready"
    assert status["decode"] == {"desired": 2, "ready": 2, "updated": 2, "summary": "2/2"}
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "True"
    created = [e.message for p in plans for e in p.events if e.reason == "GroupCreated"]
    assert len(created) == 2, "one Event per role"
    assert sorted(g for m in created for g in named_groups(m)) == ["tiny-decode-0", "tiny-decode-1", "tiny-prefill-0"]
    assert "created decode groups tiny-decode-0, tiny-decode-1 at revision" in " ".join(created)
    services = sorted(name for kind, name in cluster.owned if kind == "Service")
    assert services == ["tiny-decode", "tiny-prefill", "tiny-router"], "one headless Service per role"
    assert reasons(plans).count("PoolReady") == 1


def test_planning_again_after_convergence_writes_nothing() -> None:
    cluster = FakeCluster(pool_body())
    cluster.converge()
    writes = cluster.writes
    for _ in range(3):
        assert cluster.step().empty
    assert cluster.writes == writes


def test_every_owned_object_carries_the_standard_labels_and_an_owner_reference() -> None:
    cluster = FakeCluster(pool_body())
    cluster.converge()
    for obj in cluster.owned.values():
        meta = obj["metadata"]
        assert meta["labels"][labels.MANAGED_BY] == "pdfleet"
        assert meta["labels"][labels.POOL] == "tiny"
        assert meta["labels"]["app.kubernetes.io/part-of"] == "pdfleet"
        assert meta["ownerReferences"] == [{"apiVersion": "pdfleet.dev/v1alpha1", "kind": "InferencePool",
                                            "name": "tiny", "uid": "uid-1", "controller": True,
                                            "blockOwnerDeletion": True}]


def test_objects_written_but_not_yet_seen_are_not_written_again() -> None:
    pool = pool_body()
    first = reconcile.plan(pool, Observed(pool=pool, owned={}), now=NOW)
    expect = Expectations(applied={(o["kind"], o["metadata"]["name"]): o["metadata"]["annotations"][
        labels.APPLIED_HASH] for o in first.apply})
    again = reconcile.plan(pool, Observed(pool=pool, owned={}), expect=expect, now=NOW)
    assert again.apply == ()


@pytest.mark.effect("spec.decode.replicas")
def test_scaling_down_deletes_the_highest_groups_and_says_so() -> None:
    cluster = FakeCluster(pool_body(decode=3))
    cluster.converge()
    cluster.pool["spec"]["decode"]["replicas"] = 1
    cluster.pool["metadata"]["generation"] = 2
    plans = cluster.converge()
    assert cluster.pods() == ["tiny-decode-0-0", "tiny-prefill-0-0"]
    assert ("Service", "tiny-decode-2") not in cluster.owned
    assert reasons(plans).count("GroupDeleted") == 2
    assert "Scaled" in reasons(plans)
    assert cluster.pool["status"]["decode"]["desired"] == 1


def test_scaling_never_replaces_the_groups_that_stay() -> None:
    cluster = FakeCluster(pool_body(decode=1))
    cluster.converge()
    uid = cluster.owned[("Pod", "tiny-decode-0-0")]["metadata"]["uid"]
    cluster.pool["spec"]["decode"]["replicas"] = 2
    plans = cluster.converge()
    assert cluster.owned[("Pod", "tiny-decode-0-0")]["metadata"]["uid"] == uid
    assert not any(ref.name == "tiny-decode-0-0" for p in plans for ref in p.delete)


def named_groups(message: str) -> list[str]:
    """The groups an Event names: '<verb> <role> group(s) a, b with|at revision ...'."""
    return message.split(" with revision")[0].split(" at revision")[0].split(" ", 3)[3].split(", ")


def replaced_roles(plan: Plan) -> list[str]:
    """The role of each group the plan replaces (one Event per role names all of them)."""
    return [e.message.split()[1] for e in plan.events if e.reason == "GroupReplaced"
            for _ in named_groups(e.message)]


@pytest.mark.effect("spec.engine.overlapSchedule", "spec.rollout.order")
def test_an_engine_change_replaces_groups_one_at_a_time_decode_first() -> None:
    cluster = FakeCluster(pool_body(**NO_BAKE, prefill=2, decode=2))
    cluster.converge()
    cluster.pool["spec"]["engine"]["overlapSchedule"] = "Disabled"
    plans = cluster.converge(limit=20)
    order = [role for plan in plans for role in replaced_roles(plan)]
    assert order == ["decode", "decode", "prefill", "prefill"], "maxUnavailable 1: one group at a time, decode first"
    for kind, name in cluster.owned:
        if kind == "Pod":
            assert "--disable-overlap-schedule" in cluster.owned[(kind, name)]["spec"]["containers"][0]["args"]
    assert cluster.pool["status"]["phase"] == "Ready"


@pytest.mark.effect("spec.rollout.order")
def test_prefill_first_rolls_prefill_before_decode() -> None:
    cluster = FakeCluster(pool_body(**NO_BAKE, prefill=2, decode=2, rollout__order="PrefillFirst"))
    cluster.converge()
    cluster.pool["spec"]["engine"]["overlapSchedule"] = "Disabled"
    order = [role for plan in cluster.converge(limit=20) for role in replaced_roles(plan)]
    assert order == ["prefill", "prefill", "decode", "decode"]


def test_the_second_role_waits_while_a_new_group_of_the_first_is_not_ready() -> None:
    # A revision that does not come up stops at the first role: the other role keeps serving on the old one.
    cluster = FakeCluster(pool_body(**NO_BAKE, prefill=1, decode=1))
    cluster.converge()
    cluster.pool["spec"]["engine"]["overlapSchedule"] = "Disabled"
    assert replaced_roles(cluster.step()) == ["decode"]
    cluster.step()  # creates the new decode group
    [new_decode] = [n for n in cluster.pods() if "-decode-" in n]
    cluster.owned[("Pod", new_decode)]["status"]["conditions"] = [{"type": "Ready", "status": "False"}]
    for _ in range(3):
        plan = cluster.step()
        assert replaced_roles(plan) == [] and not plan.delete, "prefill must wait for the new decode group"
    cluster.owned[("Pod", new_decode)]["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
    assert replaced_roles(cluster.step()) == ["prefill"]


def test_a_group_with_a_failed_pod_restarts_as_a_unit() -> None:
    cluster = FakeCluster(pool_body(base="multinode-decode"))
    cluster.converge()
    decode_pods = [n for n in cluster.pods() if "-decode-0-" in n]
    assert len(decode_pods) >= 2
    cluster.owned[("Pod", decode_pods[1])]["status"]["phase"] = "Failed"
    plan = cluster.step()
    assert sorted(ref.name for ref in plan.delete) == decode_pods, "every pod of the group goes, not just one"
    assert [e.reason for e in plan.events] == ["GroupRestarted"]
    cluster.converge()
    group = next(g for g in cluster.pool["status"]["groups"] if g["name"].endswith("decode-0"))
    assert group["restarts"] == 1


@pytest.mark.effect("spec.engine.sglangVersion")
def test_an_invalid_spec_is_rejected_and_nothing_in_the_fleet_changes() -> None:
    cluster = FakeCluster(pool_body())
    cluster.converge()
    before = copy.deepcopy(cluster.owned)
    cluster.pool["spec"]["engine"]["patches"] = ["kv-poll-lockstep"]
    cluster.pool["spec"]["engine"]["sglangVersion"] = "0.4.0"
    plan = cluster.step()
    assert plan.apply == () and plan.delete == ()
    accepted = next(c for c in cluster.pool["status"]["conditions"] if c["type"] == "Accepted")
    assert accepted["status"] == "False"
    assert "spec.engine.patches[0]" in accepted["message"]
    assert [e.reason for e in plan.events] == ["SpecRejected"]
    assert cluster.owned == before
    again = cluster.step()
    assert again.empty, "the rejection is reported once, not on every resync"
    assert again.rejected, "yet every reconcile of a rejected spec counts as rejected"


@pytest.mark.effect("spec.paused")
def test_a_paused_pool_creates_nothing() -> None:
    cluster = FakeCluster(pool_body(prefill=0, decode=0, paused=True))
    cluster.converge()
    assert cluster.owned == {}
    assert cluster.pool["status"]["phase"] == "Paused"


def test_condition_times_move_only_when_a_status_flips() -> None:
    cluster = FakeCluster(pool_body())
    cluster.converge()
    first = {c["type"]: c["lastTransitionTime"] for c in cluster.pool["status"]["conditions"]}
    later = NOW + datetime.timedelta(hours=1)
    plan = reconcile.plan(cluster.pool, cluster.observed(), now=later)
    assert plan.status is None
    assert first["Ready"] == "2026-11-30T12:00:00Z"


def test_planning_never_mutates_what_it_observed() -> None:
    """The cache hands out its own bodies by reference; the planner must only read them."""
    cluster = FakeCluster(pool_body(decode=2))
    cluster.converge()
    cluster.pool["spec"]["decode"]["replicas"] = 1
    cluster.pool["spec"]["engine"]["overlapSchedule"] = "Disabled"
    observed = cluster.observed()
    before = copy.deepcopy((observed.pool, dict(observed.owned)))
    reconcile.plan(cluster.pool, observed, now=NOW)
    assert (observed.pool, dict(observed.owned)) == before


def test_a_new_kv_layout_replaces_every_group_at_once_and_never_mixes_layouts() -> None:
    cluster = FakeCluster(pool_body(prefill=2, decode=2))
    cluster.converge()
    old = {name for kind, name in cluster.owned if kind == "Pod"}
    cluster.pool["spec"]["engine"]["extraArgs"] = ["--page-size", "64"]  # changes how KV pages are laid out
    first = cluster.step()
    assert {ref.name for ref in first.delete} == old, "every group of both roles goes at once"
    assert [o for o in first.apply if o["kind"] == "Pod"] == [], "no new-layout pod while old ones exist"
    assert [e.reason for e in first.events] == ["LayoutChanged"]
    plans = cluster.converge(limit=10)
    layouts = {cluster.owned[("Pod", n)]["metadata"]["labels"]["pdfleet.dev/kv-layout"] for n in cluster.pods()}
    assert len(layouts) == 1
    assert len(cluster.pods()) == 4
    assert "GroupCreated" in reasons(plans)


def test_a_change_that_keeps_the_layout_still_rolls_group_by_group() -> None:
    cluster = FakeCluster(pool_body(prefill=2, decode=2))
    cluster.converge()
    cluster.pool["spec"]["engine"]["patches"] = ["dsml-leak-guard"]
    plan = cluster.step()
    assert "LayoutChanged" not in [e.reason for e in plan.events]
    assert len({ref.name for ref in plan.delete}) == 1, "one group at a time, within maxUnavailable"


def test_per_group_services_of_an_older_operator_are_removed_without_touching_the_groups() -> None:
    cluster = FakeCluster(pool_body(prefill=1, decode=2))
    cluster.converge()
    old = copy.deepcopy(cluster.owned[("Service", "tiny-decode")])
    old["metadata"]["name"] = "tiny-decode-1"
    old["metadata"]["labels"][labels.GROUP] = "tiny-decode-1"
    cluster.owned[("Service", "tiny-decode-1")] = old
    plan = cluster.step()
    assert [(ref.kind, ref.name) for ref in plan.delete] == [("Service", "tiny-decode-1")]
    assert plan.events == (), "no group was deleted"


def test_a_router_the_operator_has_not_read_yet_keeps_what_the_status_said_of_it() -> None:
    """An operator restarted over a converged pool has read no router yet: it writes nothing until it has, and
    then only what changed (it once wrote the status without the routers, then with them again)."""
    cluster = FakeCluster(pool_body(prefill=1, decode=1))
    cluster.routers = {"tiny-router-a": RouterView("tiny-router-a", {"prefill": 1, "decode": 1})}
    cluster.converge()
    said = cluster.pool["status"]["routers"]
    assert said == [{"name": "tiny-router-a", "availablePrefill": 1, "availableDecode": 1, "openCircuits": 0,
                     "missingWorkers": 0}]
    health, engines = cluster.answers()
    observed = cluster.observed()
    restarted = reconcile.plan(cluster.pool, observed, now=NOW, health=health, engines=engines, routers={})
    assert restarted.empty, restarted
    gone = dataclasses.replace(observed, routers=())
    left = reconcile.plan(cluster.pool, gone, now=NOW, health=health, engines=engines, routers={}).status
    assert left is not None and "routers" not in left, "a router pod that is gone is no longer said"


def test_a_pool_whose_every_router_lacks_a_role_is_not_ready_and_says_which_routers_and_why() -> None:
    """What the operator read of the routers (routers with circuit breakers): a router with no available worker of
    a role answers that role's requests 503, so it does not count as serving."""
    cluster = FakeCluster(pool_body(prefill=1, decode=1))
    cluster.converge()
    routers = (
        {"metadata": {"name": "tiny-router-a", "uid": "r-a"}, "status": {"phase": "Running", "podIP": "10.0.0.9"}},)
    stuck = {"tiny-router-a": RouterView("tiny-router-a", {"prefill": 0, "decode": 1}, ("http://10.0.0.1:30000",))}
    health, engines = cluster.answers()
    observed = Observed(pool=copy.deepcopy(cluster.pool), owned=copy.deepcopy(cluster.owned), routers=routers)
    status = reconcile.plan(cluster.pool, observed, now=NOW, health=health, engines=engines, routers=stuck).status
    assert status is not None
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "False"
    assert "router not available" in ready["message"] and "tiny-router-a has no available prefill worker" in \
        ready["message"]
    assert status["routers"] == [{"name": "tiny-router-a", "availablePrefill": 0, "availableDecode": 1,
                                  "openCircuits": 1, "missingWorkers": 0}]
    healthy = {"tiny-router-a": RouterView("tiny-router-a", {"prefill": 1, "decode": 1})}
    cluster.pool["status"] = status
    again = reconcile.plan(cluster.pool, observed, now=NOW, health=health, engines=engines, routers=healthy).status
    assert again is not None
    assert next(c for c in again["conditions"] if c["type"] == "Ready")["status"] == "True"
