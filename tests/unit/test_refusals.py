"""A write of the pool's own objects that the apiserver refuses for good (a 4xx other than a conflict, a timeout or
throttling) shows in the pool's status, with the apiserver's message, and in one Warning event, in the same
reconcile; it is not retried in a silent backoff loop. Conflicts and 5xx still are."""

from __future__ import annotations

import dataclasses
import datetime
from typing import Any

import pytest

from pdfleet.operator.controller import Controller
from pdfleet.operator.planning import refusals
from pdfleet.operator.workqueue import Retry
from tests.support.fake_kube import FakeKube
from tests.support.pools import pool_body

KEY = ("ns", "tiny")
NOW = datetime.datetime(2026, 11, 30, 12, 0, tzinfo=datetime.UTC)
Body = dict[str, Any]


@pytest.mark.parametrize(("code", "refused"), [
    (400, True), (403, True), (404, True), (405, True), (413, True), (422, True),
    (408, False), (409, False), (429, False), (500, False), (503, False), (0, False), (200, False)])
def test_only_what_a_retry_cannot_change_is_a_refusal(code: int, refused: bool) -> None:
    assert refusals.is_refusal(code) is refused


QUOTA = refusals.Refusal("apply", "Service", "tiny-router", 403, "Forbidden",
                         'services "tiny-router" is forbidden: exceeded quota: no-services')


def accepted(status: Body) -> Body:
    return next(c for c in status["conditions"] if c["type"] == "Accepted")


def test_a_refusal_is_said_once_in_the_status_and_once_as_a_warning() -> None:
    pool = pool_body()
    status, events = refusals.refused_status(pool, None, [QUOTA], NOW)
    assert status is not None and status["phase"] == "Degraded"
    cond = accepted(status)
    assert (cond["status"], cond["reason"]) == ("False", "WriteRefused")
    assert "apply Service tiny-router: 403 Forbidden: " in cond["message"] and "exceeded quota" in cond["message"]
    assert [(e.type, e.reason, e.message) for e in events] == [("Warning", "WriteRefused", cond["message"])]

    pool["status"] = status  # written: the same refusal again changes nothing and says nothing
    later = NOW + datetime.timedelta(minutes=5)
    assert refusals.refused_status(pool, None, [QUOTA], later) == (None, ())
    other = refusals.Refusal("delete", "Pod", "tiny-decode-0-0", 422, "Invalid", "nope")
    status, events = refusals.refused_status(pool, None, [other], later)
    assert status is not None and len(events) == 1 and "tiny-decode-0-0" in events[0].message
    assert accepted(status)["lastTransitionTime"] == cond["lastTransitionTime"]  # still False: no transition


def test_the_same_refusals_in_another_order_or_wording_are_not_said_again() -> None:
    # Writes go out together and fail in any order; the apiserver's wording may change (a quota's usage, say).
    router = refusals.Refusal("apply", "Service", "tiny-router", 403, "Forbidden", "exceeded quota: used 0")
    group = refusals.Refusal("apply", "Service", "tiny-decode-0", 403, "Forbidden", "exceeded quota: used 0")
    pool = pool_body()
    pool["status"], events = refusals.refused_status(pool, None, [router, group], NOW)
    assert len(events) == 1
    reworded = dataclasses.replace(router, message="exceeded quota: used 1")
    status, events = refusals.refused_status(pool, None, [group, reworded], NOW)
    assert events == () and status is not None and "used 1" in accepted(status)["message"]


def test_a_write_refused_again_is_not_news_and_a_newly_refused_one_is() -> None:
    router = refusals.Refusal("apply", "Service", "tiny-router", 403, "Forbidden", "exceeded quota")
    prefill, decode = (dataclasses.replace(router, name=f"tiny-{role}") for role in ("prefill", "decode"))
    pool = pool_body()
    pool["status"], events = refusals.refused_status(pool, None, [router, prefill], NOW)
    assert len(events) == 1
    # The quota is raised while the writes are in flight: one passes, the other is refused once more.
    status, events = refusals.refused_status(pool, None, [router], NOW)
    assert events == () and status is not None and "tiny-prefill" not in accepted(status)["message"]
    pool["status"] = status
    # A write that the status no longer names is refused again (the quota lowered once more): that is news.
    status, events = refusals.refused_status(pool, None, [router, prefill], NOW)
    assert len(events) == 1 and "tiny-prefill" in events[0].message
    pool["status"] = status
    assert refusals.refused_status(pool, None, [router, prefill, decode], NOW)[1] != (), "a newly refused write"


def test_more_writes_than_are_named_are_said_once_and_an_unnamed_one_alone_is_news() -> None:
    many = [refusals.Refusal("apply", "Pod", f"p-{i:02}", 403, "Forbidden", "no") for i in range(12)]
    pool = pool_body()
    pool["status"], events = refusals.refused_status(pool, None, many, NOW)
    assert "and 2 more" in events[0].message
    assert refusals.refused_status(pool, None, many[::-1], NOW)[1] == (), "the same twelve, every resync"
    assert refusals.refused_status(pool, None, many[:10], NOW)[1] == (), "all ten were named"
    assert refusals.refused_status(pool, None, many[-1:], NOW)[1] != (), "p-11 was only counted"


def test_many_refusals_are_listed_up_to_a_few_and_counted() -> None:
    many = [refusals.Refusal("apply", "Pod", f"p-{i}", 403, "Forbidden", "x" * 5000) for i in range(10)]
    message = refusals.describe(many)
    assert message.startswith("the apiserver refused 10 write(s)") and message.endswith("; and 7 more")
    assert len(message) < 4 * (refusals.MAX_MESSAGE + 100)


@pytest.fixture
def kube() -> FakeKube:
    kube = FakeKube()
    kube.seed(pool_body())
    return kube


def warnings(kube: FakeKube) -> list[Body]:
    return [e for e in kube.of_kind("Event", "ns") if e["reason"] == "WriteRefused"]


def pool_status(kube: FakeKube) -> Body:
    body = kube.get("InferencePool", *KEY)
    assert body is not None
    return body["status"]


@pytest.mark.parametrize("code", [400, 403, 422])
async def test_a_refused_write_shows_in_status_and_one_event_in_the_same_reconcile(kube: FakeKube, code: int) -> None:
    controller = Controller(client=kube, cache=kube.cache())
    kube.fail("apply", kind="Service", name="tiny-router", status=code, times=3)

    await controller.reconcile(KEY)  # no Retry: a retry would be refused the same way

    writes = kube.take_writes()
    assert [(w.kind, w.name, w.code) for w in writes if not w.ok] == [("Service", "tiny-router", code)]
    assert kube.get("Pod", "ns", "tiny-decode-0-0") is not None, "what was not refused still goes out"
    cond = accepted(pool_status(kube))
    assert (cond["status"], cond["reason"]) == ("False", "WriteRefused")
    assert f"apply Service tiny-router: {code} " in cond["message"]
    assert "injected failure of apply Service tiny-router" in cond["message"]  # the apiserver's own words
    assert pool_status(kube)["phase"] == "Degraded"
    assert [e["type"] for e in warnings(kube)] == ["Warning"]
    assert warnings(kube)[0]["message"] == cond["message"]

    await controller.reconcile(KEY)  # the status moves on (the pods now exist), still refused: no new Warning
    assert accepted(pool_status(kube))["reason"] == "WriteRefused"
    kube.take_writes()
    await controller.reconcile(KEY)  # nothing new to say: one try of the refused write, and nothing else
    assert [(w.kind, w.code) for w in kube.take_writes()] == [("Service", code)]
    assert len(warnings(kube)) == 1

    await controller.reconcile(KEY)  # the quota is lifted (the failure is used up): the pool is accepted again
    assert kube.get("Service", "ns", "tiny-router") is not None
    assert accepted(pool_status(kube))["status"] == "True"


async def test_a_refusal_with_a_retryable_failure_is_reported_and_retried(kube: FakeKube) -> None:
    controller = Controller(client=kube, cache=kube.cache())
    kube.fail("apply", kind="Service", name="tiny-router", status=403, times=5)
    kube.fail("create", kind="Pod", name="tiny-decode-0-0", status=503)

    with pytest.raises(Retry):
        await controller.reconcile(KEY)

    assert accepted(pool_status(kube))["reason"] == "WriteRefused"
    assert len(warnings(kube)) == 1
    events = [e["reason"] for e in kube.of_kind("Event", "ns")]
    assert events.count("GroupCreated") == 1, "the group whose pod failed is not said to be created"


async def test_a_refused_delete_is_reported_too(kube: FakeKube) -> None:
    controller = Controller(client=kube, cache=kube.cache())
    await controller.reconcile(KEY)
    await controller.reconcile(KEY)
    kube.take_writes()
    kube.update("InferencePool", *KEY, lambda p: p["spec"].update(router={"replicas": 0}))
    kube.fail("delete", kind="Deployment", name="tiny-router", status=403, times=5)

    await controller.reconcile(KEY)

    assert kube.get("Deployment", "ns", "tiny-router") is not None
    assert "delete Deployment tiny-router: 403 Forbidden" in accepted(pool_status(kube))["message"]
    assert len(warnings(kube)) == 1
