"""Which engines a pool's routers keep in rotation, and the changes that get them there (pure)."""

from __future__ import annotations

import copy

import pytest

from pdfleet.operator.api.roles import Role
from pdfleet.operator.api.spec import InferencePoolSpec
from pdfleet.operator.api.status import Verdict
from pdfleet.operator.planning.router.router_membership import Registered, Worker, in_rotation, plan
from tests.support.pools import example

SPEC = InferencePoolSpec.model_validate(example("local-fleet")["spec"])


def pod(group: str, role: str, ip: str | None, *, ready: bool = True, rank: int = 0,
        terminating: bool = False) -> dict:
    meta: dict = {"name": f"{group}-{rank}", "uid": f"uid-{group}-{rank}",
                  "labels": {"pdfleet.dev/group": group, "pdfleet.dev/role": role, "pdfleet.dev/node-rank": str(rank)}}
    if terminating:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    status: dict = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}
    if ip:
        status["podIP"] = ip
    return {"metadata": meta, "status": status}


FLEET = [pod("f-prefill-0", "prefill", "127.1.0.2"), pod("f-prefill-1", "prefill", "127.1.0.3"),
         pod("f-decode-0", "decode", "127.1.1.2"), pod("f-decode-1", "decode", "127.1.1.3")]


def test_every_ready_healthy_leader_is_in_rotation_with_its_role_and_bootstrap_port() -> None:
    wanted, left_out = in_rotation(SPEC, FLEET, {})
    assert left_out == {}
    assert wanted["http://127.1.0.2:30000"] == Worker("http://127.1.0.2:30000", Role.PREFILL, 8998, "f-prefill-0")
    assert wanted["http://127.1.1.3:30000"] == Worker("http://127.1.1.3:30000", Role.DECODE, None, "f-decode-1")
    assert len(wanted) == 4


@pytest.mark.parametrize("verdict", [Verdict.DESYNC, Verdict.HANG, Verdict.DEAD, Verdict.UNREACHABLE])
def test_a_sick_group_leaves_rotation_at_once(verdict: Verdict) -> None:
    wanted, left_out = in_rotation(SPEC, FLEET, {"f-decode-0": verdict})
    assert "http://127.1.1.2:30000" not in wanted
    assert left_out == {"http://127.1.1.2:30000": str(verdict)}


def test_a_group_whose_verdict_is_not_known_yet_serves() -> None:
    wanted, _ = in_rotation(SPEC, FLEET, {"f-decode-0": Verdict.UNKNOWN, "f-decode-1": Verdict.HEALTHY})
    assert {"http://127.1.1.2:30000", "http://127.1.1.3:30000"} <= wanted.keys()


def test_not_ready_terminating_and_addressless_pods_are_out() -> None:
    pods = [pod("f-decode-0", "decode", "127.1.1.2", ready=False),
            pod("f-decode-1", "decode", "127.1.1.3", terminating=True),
            pod("f-prefill-0", "prefill", None)]
    wanted, left_out = in_rotation(SPEC, pods, {})
    assert wanted == {}
    assert left_out == {"http://127.1.1.2:30000": "not Ready", "http://127.1.1.3:30000": "terminating"}


def test_a_multi_node_group_serves_from_its_leader_only_once_every_node_is_ready() -> None:
    spec = SPEC.model_copy(update={"decode": SPEC.decode.model_copy(update={"nodes_per_group": 2})})
    half = [pod("f-decode-0", "decode", "127.1.1.2", rank=0), pod("f-decode-0", "decode", "127.1.2.2", rank=1,
                                                                  ready=False)]
    assert in_rotation(spec, half, {})[0] == {}
    whole = copy.deepcopy(half)
    whole[1]["status"]["conditions"][0]["status"] = "True"
    assert list(in_rotation(spec, whole, {})[0]) == ["http://127.1.1.2:30000"]


def reg(url: str, kind: str, i: int = 0) -> Registered:
    return Registered(id=f"id-{i}-{url}", url=url, worker_type=kind)


def test_a_router_that_matches_needs_nothing() -> None:
    wanted, left_out = in_rotation(SPEC, FLEET, {})
    registered = [reg(w.url, str(w.role)) for w in wanted.values()]
    changes = plan(wanted, registered, left_out, missing_since={}, now=100.0, grace=5.0)
    assert not changes and changes.missing_since == {}


def test_a_sick_registration_is_removed_at_once_a_stale_one_after_the_grace() -> None:
    wanted, left_out = in_rotation(SPEC, FLEET, {"f-decode-0": Verdict.DESYNC})
    registered = [reg(w, "prefill" if ".0." in w else "decode") for w in
                  ("http://127.1.0.2:30000", "http://127.1.0.3:30000", "http://127.1.1.2:30000",
                   "http://127.1.1.3:30000", "http://127.1.1.9:30000")]
    first = plan(wanted, registered, left_out, missing_since={}, now=100.0, grace=5.0)
    assert {(r.worker.url, r.reason) for r in first.remove} == {("http://127.1.1.2:30000", "Desync")}
    assert first.unwanted_since == {"http://127.1.1.9:30000": 100.0}
    # The stale one may be a pod the operator has not seen yet: it goes only once the grace is over.
    later = plan(wanted, registered, left_out, missing_since={}, unwanted_since=first.unwanted_since, now=105.0,
                 grace=5.0)
    assert {(r.worker.url, r.reason) for r in later.remove} == {
        ("http://127.1.1.2:30000", "Desync"), ("http://127.1.1.9:30000", "no such engine in the pool")}
    assert later.add == ()


def test_a_group_being_deleted_leaves_every_router_at_once_while_a_not_ready_one_waits_for_the_grace() -> None:
    # A rollout or a restart deleted decode-1's pod: its preStop drain lets in-flight requests finish, and no new
    # request may reach it meanwhile. Not Ready may be the operator's view lagging behind; deleted never is.
    pods = [pod("f-decode-0", "decode", "127.1.1.2", ready=False), pod("f-decode-1", "decode", "127.1.1.3",
                                                                       terminating=True)]
    wanted, left_out = in_rotation(SPEC, pods, {})
    registered = [reg("http://127.1.1.2:30000", "decode"), reg("http://127.1.1.3:30000", "decode")]
    changes = plan(wanted, registered, left_out, missing_since={}, now=100.0, grace=5.0)
    assert [(r.worker.url, r.reason) for r in changes.remove] == [("http://127.1.1.3:30000", "terminating")]
    assert changes.unwanted_since == {"http://127.1.1.2:30000": 100.0}


def test_a_worker_the_router_saw_turn_ready_first_is_not_removed_when_the_operator_catches_up() -> None:
    pods = [*FLEET[:3], pod("f-decode-1", "decode", "127.1.1.3", ready=False)]
    wanted, left_out = in_rotation(SPEC, pods, {})
    registered = [reg(f"http://{p['status']['podIP']}:30000", p["metadata"]["labels"]["pdfleet.dev/role"])
                  for p in FLEET]
    lagging = plan(wanted, registered, left_out, missing_since={}, now=100.0, grace=5.0)
    assert lagging.remove == ()
    wanted, left_out = in_rotation(SPEC, FLEET, {})
    caught_up = plan(wanted, registered, left_out, missing_since={}, unwanted_since=lagging.unwanted_since,
                     now=102.0, grace=5.0)
    assert not caught_up and caught_up.unwanted_since == {}


def test_a_missing_worker_is_added_only_after_the_grace_its_discovery_gets() -> None:
    wanted, left_out = in_rotation(SPEC, FLEET, {})
    registered = [reg(w.url, str(w.role)) for w in wanted.values() if w.group != "f-decode-1"]
    first = plan(wanted, registered, left_out, missing_since={}, now=100.0, grace=5.0)
    assert first.add == () and first.missing_since == {"http://127.1.1.3:30000": 100.0}
    early = plan(wanted, registered, left_out, missing_since=first.missing_since, now=104.0, grace=5.0)
    assert early.add == ()
    due = plan(wanted, registered, left_out, missing_since=early.missing_since, now=105.0, grace=5.0)
    assert [w.group for w in due.add] == ["f-decode-1"]
    # Once the router has it, nothing is remembered.
    done = plan(wanted, [*registered, reg("http://127.1.1.3:30000", "decode")], left_out,
                missing_since=due.missing_since, now=106.0, grace=5.0)
    assert not done and done.missing_since == {}


def test_a_worker_registered_with_the_wrong_role_is_replaced() -> None:
    wanted, left_out = in_rotation(SPEC, FLEET[:1], {})
    changes = plan(wanted, [reg("http://127.1.0.2:30000", "decode")], left_out, missing_since={}, now=1.0,
                   grace=0.0)
    assert [r.reason for r in changes.remove] == ["registered as decode, is prefill"]
    assert [w.url for w in changes.add] == ["http://127.1.0.2:30000"]
