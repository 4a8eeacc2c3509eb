"""The role scaler's memory of its own writes (`operator.role_scaler`): kopf's indices show a write only when its
watch event arrives, and an event of the other object can come first. Planning from the stale copies would take
the pool's old replicas for a person's edit and write them back over the scale. A fake API that stores what it is
sent stands in for the apiserver; the e2e test runs the real one."""

from __future__ import annotations

import copy
from typing import Any

from pdfleet.operator.api.roles import Role
from pdfleet.operator.kube.kube_client import KubeError
from pdfleet.operator.planning import spec_change
from pdfleet.operator.planning.scale import role_scale_plan
from pdfleet.operator.role_scaler import RoleScaler

Body = dict[str, Any]
KEY = ("ns", "p")


class FakeApi:
    """Stores the pool and the InferencePoolRoles as the apiserver would, and records every write."""

    def __init__(self, pool: Body, objects: list[Body]) -> None:
        self.pool = pool
        self.objects = {o["metadata"]["name"]: o for o in objects}
        self.writes: list[tuple[str, str, Any]] = []

    async def request(self, method: str, path: str, *, body: Any = None, content_type: str = "", **_: Any) -> Body:
        self.writes.append((method, path, body))
        if "/inferencepools/" in path:
            change = spec_change.SpecChange(ops=tuple(body), why="")
            try:
                stored = spec_change.apply(self.pool, change)
            except ValueError:
                raise KubeError(422, "Invalid", "test failed") from None
            stored["metadata"]["generation"] += 1
            self.pool = stored
            return copy.deepcopy(stored)
        name = path.split("/inferencepoolroles/")[1].split("/")[0]
        obj = self.objects[name]
        if path.endswith("/status"):
            obj["status"] = {k: v for k, v in {**obj.get("status", {}), **body["status"]}.items() if v is not None}
        else:
            obj["spec"]["replicas"] = body["spec"]["replicas"]
            obj["metadata"]["generation"] += 1
        return copy.deepcopy(obj)

    async def create(self, obj: Body) -> Body:
        self.writes.append(("POST", obj["kind"], obj))
        return {**obj, "metadata": {**obj["metadata"], "generation": 1}}

    async def delete(self, *args: Any, **kwargs: Any) -> None:
        self.writes.append(("DELETE", args[3], None))


def _pool(decode: int) -> Body:
    return {"apiVersion": "pdfleet.dev/v1alpha1", "kind": "InferencePool",
            "metadata": {"name": "p", "namespace": "ns", "uid": "u", "generation": 3, "resourceVersion": "10"},
            "spec": {"prefill": {"replicas": 1}, "decode": {"replicas": decode, "scaleTarget": True}},
            "status": {"groups": [], "decode": {"ready": 0}}}


def _role(replicas: int, *, generation: int, observed: int) -> Body:
    body = role_scale_plan.desired_object(_pool(1), Role.DECODE)
    body["metadata"].update(generation=generation, resourceVersion="20", uid="r")
    body["spec"]["replicas"] = replicas
    body["status"] = {"replicas": 0, "readyReplicas": 0, "selector": role_scale_plan.selector("p", Role.DECODE),
                      "observedGeneration": observed}
    return body


async def test_a_stale_index_after_a_scale_does_not_write_the_old_replicas_back() -> None:
    stale_pool, stale_role = _pool(1), _role(3, generation=2, observed=1)  # kubectl scale --replicas=3
    api = FakeApi(copy.deepcopy(stale_pool), [copy.deepcopy(stale_role)])
    # The indices keep showing what they showed before the scaler's writes (their watch events not in yet).
    scaler = RoleScaler(client=api, pool=lambda key: copy.deepcopy(stale_pool),  # type: ignore[arg-type]
                        objects={KEY: [stale_role]})
    await scaler.sync(KEY)
    assert api.pool["spec"]["decode"]["replicas"] == 3
    assert api.objects["p-decode"]["status"]["observedGeneration"] == 2
    written = len(api.writes)

    await scaler.sync(KEY)  # another event, the indices still stale
    assert api.pool["spec"]["decode"]["replicas"] == 3, "the scale was not undone"
    assert api.objects["p-decode"]["spec"]["replicas"] == 3
    assert not any(method == "PATCH" and "/inferencepools/" in path for method, path, _ in api.writes[written:])


async def test_without_its_memory_the_same_stale_index_would_undo_the_scale() -> None:
    """The premise of the test above: planned from the stale copies alone, the pool's old 1 reads as a person's
    edit once the scale's status is seen, and is written over the InferencePoolRole's 3."""
    seen_role = _role(3, generation=2, observed=2)  # the status write seen, the pool's patch not yet
    plan = role_scale_plan.plan(_pool(1), [seen_role])
    [step] = plan.steps
    assert step.replicas == 1


async def test_an_edit_of_the_pool_right_after_a_scale_is_not_taken_for_another_scale() -> None:
    """The scale mirrored (its status written), then a person sets the pool's decode replicas to 5 while the
    InferencePoolRole's index still shows its status from before: the 5 goes into the InferencePoolRole."""
    stale_role = _role(3, generation=2, observed=1)
    api = FakeApi(_pool(1), [copy.deepcopy(stale_role)])
    seen: dict[str, Body] = {"pool": _pool(1)}
    scaler = RoleScaler(client=api, pool=lambda key: copy.deepcopy(seen["pool"]),  # type: ignore[arg-type]
                        objects={KEY: [stale_role]})
    await scaler.sync(KEY)  # the scale: pool 1 -> 3, status observedGeneration 2
    edited = copy.deepcopy(api.pool)
    edited["spec"]["decode"]["replicas"] = 5
    edited["metadata"]["generation"] += 1
    api.pool, seen["pool"] = copy.deepcopy(edited), edited  # the pool's watch shows the edit; the role's is stale
    await scaler.sync(KEY)
    assert api.pool["spec"]["decode"]["replicas"] == 5, "the edit stands"
    assert api.objects["p-decode"]["spec"]["replicas"] == 5, "and is written into the InferencePoolRole"
