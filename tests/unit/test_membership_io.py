"""The routers' membership against a router's worker API over real HTTP (`tests.support.fake_engines`): the
requests it sends, when, and the Events it posts through the executor. Which engines belong in rotation is
`test_router_membership`'s business (pure)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping

import pytest

from pdfleet.operator.api.spec import InferencePoolSpec
from pdfleet.operator.api.status import Verdict
from pdfleet.operator.engines.membership import GRACE_S
from pdfleet.operator.planning.health.rank_health import GroupHealth
from tests.support.fake_fleet import DECODE, KEY, PREFILL, URLS, Fleet, fake_fleet


@pytest.fixture
async def fleet() -> AsyncIterator[Fleet]:
    async with fake_fleet() as fleet:
        yield fleet


async def sync(fleet: Fleet, at: float, verdicts: Mapping[str, Verdict] | None = None) -> None:
    """One round of the membership at `at` seconds, with these verdicts (none: not judged yet)."""
    fleet.clock[0] = at
    pool = fleet.kube.get("InferencePool", *KEY)
    assert pool is not None
    health = {g: GroupHealth(v, None, str(v), 1) for g, v in (verdicts or {}).items()}
    await fleet.membership.sync(KEY, InferencePoolSpec.model_validate(pool["spec"]), fleet.kube.cache().snapshot(KEY),
                                health)


def changes(fleet: Fleet) -> list[tuple[str, str, object]]:
    got = fleet.router.changes()
    fleet.router.requests.clear()
    return got


async def test_a_router_that_has_every_engine_is_only_asked(fleet: Fleet) -> None:
    await sync(fleet, 0)
    await sync(fleet, 100)
    assert fleet.router.requests == [("GET", "/workers", None)] * 2
    assert fleet.kube.take_writes() == []


async def test_a_not_ready_engine_leaves_rotation_after_the_grace_and_comes_back_when_ready(fleet: Fleet) -> None:
    fleet.ready(DECODE, False)
    await sync(fleet, 0)
    await sync(fleet, GRACE_S - 1)
    assert changes(fleet) == []  # the router's own view may lag behind ours: give it the grace

    await sync(fleet, GRACE_S)
    assert changes(fleet) == [("DELETE", "/workers/w2", None)]
    assert fleet.router.urls() == {URLS[PREFILL]: "prefill"}
    [removed] = fleet.events("RouterWorkerRemoved")
    assert removed["type"] == "Normal" and URLS[DECODE] in removed["message"] and "not Ready" in removed["message"]

    fleet.ready(DECODE)
    await sync(fleet, 20)
    await sync(fleet, 20 + GRACE_S - 1)
    assert changes(fleet) == []  # discovery may add it by itself first
    await sync(fleet, 20 + GRACE_S)
    assert changes(fleet) == [("POST", "/workers", {"url": URLS[DECODE], "worker_type": "decode"})]
    assert fleet.router.urls() == {URLS[PREFILL]: "prefill", URLS[DECODE]: "decode"}
    [added] = fleet.events("RouterWorkerAdded")
    assert added["type"] == "Normal" and "tiny-decode-0" in added["message"]
    await sync(fleet, 100)
    assert changes(fleet) == []


@pytest.mark.parametrize("verdict", [Verdict.DESYNC, Verdict.HANG, Verdict.DEAD, Verdict.UNREACHABLE])
async def test_a_sick_engine_leaves_rotation_at_once_with_a_warning(fleet: Fleet, verdict: Verdict) -> None:
    await sync(fleet, 0, {DECODE: verdict, PREFILL: Verdict.HEALTHY})

    assert changes(fleet) == [("DELETE", "/workers/w2", None)]
    [removed] = fleet.events("RouterWorkerRemoved")
    assert removed["type"] == "Warning" and str(verdict) in removed["message"]


async def test_an_engine_the_router_lacks_is_added_with_its_bootstrap_port(fleet: Fleet) -> None:
    fleet.router.workers = [w for w in fleet.router.workers if w["worker_type"] != "prefill"]
    await sync(fleet, 0)
    await sync(fleet, GRACE_S)
    assert changes(fleet) == [("POST", "/workers",
                               {"url": URLS[PREFILL], "worker_type": "prefill", "bootstrap_port": 8998})]


async def test_a_stale_registration_and_a_wrong_role_are_removed(fleet: Fleet) -> None:
    fleet.router.register("http://127.77.0.99:30000", "decode")  # a deleted pod's: discovery never forgets it
    decode = next(w for w in fleet.router.workers if w["url"] == URLS[DECODE])
    decode["worker_type"] = "prefill"

    await sync(fleet, 0)
    assert changes(fleet) == [("DELETE", "/workers/w2", None)]  # a wrong role goes at once
    await sync(fleet, GRACE_S)
    assert sorted(changes(fleet), key=str) == [
        ("DELETE", "/workers/w3", None), ("POST", "/workers", {"url": URLS[DECODE], "worker_type": "decode"})]
    assert fleet.router.urls() == {URLS[PREFILL]: "prefill", URLS[DECODE]: "decode"}


@pytest.mark.parametrize("failing", ["GET", "DELETE"])
async def test_a_router_that_fails_is_left_alone_and_tried_again_next_time(fleet: Fleet, failing: str) -> None:
    fleet.router.failing = {failing}
    await sync(fleet, 0, {DECODE: Verdict.DESYNC})  # never raises into the monitor
    assert changes(fleet) == ([("DELETE", "/workers/w2", None)] if failing == "DELETE" else [])
    assert fleet.router.urls()[URLS[DECODE]] == "decode"
    assert fleet.events("RouterWorkerRemoved") == []  # an event says what happened, and nothing did

    fleet.router.failing = set()
    await sync(fleet, 1, {DECODE: Verdict.DESYNC})
    assert changes(fleet) == [("DELETE", "/workers/w2", None)]
    assert len(fleet.events("RouterWorkerRemoved")) == 1


async def test_an_engine_the_router_refuses_to_add_is_offered_again_without_an_event(fleet: Fleet) -> None:
    fleet.router.workers = [w for w in fleet.router.workers if w["worker_type"] != "decode"]
    fleet.router.failing = {"POST"}
    await sync(fleet, 0)
    await sync(fleet, GRACE_S)
    assert [m for m, _, _ in changes(fleet)] == ["POST"]
    assert fleet.events("RouterWorkerAdded") == []

    fleet.router.failing = set()
    await sync(fleet, GRACE_S + 1)
    assert [m for m, _, _ in changes(fleet)] == ["POST"]
    assert len(fleet.events("RouterWorkerAdded")) == 1


async def test_no_router_is_contacted_while_none_serves(fleet: Fleet) -> None:
    [router_pod] = [p for p in fleet.kube.of_kind("Pod", KEY[0]) if p["metadata"]["name"].startswith("tiny-router-")]
    fleet.kube.update("Pod", *KEY[:1], router_pod["metadata"]["name"],
                      lambda p: p["metadata"].update(deletionTimestamp="2026-11-30T12:05:00Z"))
    await sync(fleet, 0, {DECODE: Verdict.DESYNC})
    assert fleet.router.requests == []
