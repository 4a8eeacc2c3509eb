"""An in-memory apiserver behind the operator's one door to the API (`KubeClient.request`), for unit tests.

`FakeKube` *is* a `KubeClient` whose `request` answers from a dict instead of the network, so the client's own
`apply`, `delete` (a 404 is success) and `create` run unchanged on top of it. It keeps the parts of the
apiserver's contract that the executor relies on, and nothing more:

- objects by (kind, namespace, name), each given a uid, a resourceVersion (bumped on every change) and a
  creationTimestamp; `generation` bumps when anything but metadata and status changes;
- server-side apply (`application/apply-patch+yaml`): creates, or replaces what the single field manager set
  while keeping server-owned metadata and status; a Pod's spec is immutable (422, as the apiserver says);
- a status merge patch (RFC 7386) guarded by `metadata.resourceVersion`: a stale one is refused with 409;
- create (POST) with `generateName`, 409 when the name is taken; GET of one object (404 when absent), not
  recorded among the writes;
- a RoleBinding whose Role does not exist yet is refused (403), as RBAC's escalation check does for an operator
  without the `bind` verb;
- delete with a uid precondition (409 on mismatch, 404 when gone); a Pod with a grace period turns terminating
  (`deletionTimestamp`) until `finish_terminating`; deleting an object removes what it owns (the garbage
  collector, at once);
- every request of the operator is recorded in `writes`, in order, with the status code it got and when it
  started and was answered (each request takes one turn of the event loop, so requests sent together are in
  flight together), and any write can be made to fail once or more with a chosen HTTP status (`fail`).

The watch is instant unless paused (`watch_paused`): `cache()` is the operator's `Cache` over index views
built by the real index functions (`cache.pool_entry`, `owned_entry`, `router_entry`), filtered by the
managed-by label as kopf's indices are. Changes made by the test (`seed`, `update`, `remove`) play the user,
kubelet or controller-manager: they are not the operator's and are not recorded.

A request the fake does not understand fails the test (AssertionError): extend the fake rather than guess.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import datetime
import itertools
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from pdfleet.operator import cache as cache_mod
from pdfleet.operator import handlers
from pdfleet.operator.api import meta as api_meta
from pdfleet.operator.kube import api_paths
from pdfleet.operator.kube.kube_client import KubeClient, KubeError
from pdfleet.operator.kube.pool_patch import JSON_PATCH
from pdfleet.operator.planning import spec_change
from pdfleet.operator.render import labels
from pdfleet.operator.render.router_objects import COMPONENT as ROUTER_COMPONENT

Body = dict[str, Any]
Key = tuple[str, str | None, str]  # (kind, namespace, name)

APPLY = "application/apply-patch+yaml"
MERGE = "application/merge-patch+json"
REASONS = {400: "BadRequest", 403: "Forbidden", 404: "NotFound", 409: "Conflict", 410: "Gone", 422: "Invalid",
           429: "TooManyRequests", 500: "InternalError", 503: "ServiceUnavailable"}
_KINDS = {plural: (api_version, kind) for (api_version, kind), plural in api_paths.PLURALS.items()}
_SERVER_META = ("uid", "resourceVersion", "creationTimestamp", "generation", "deletionTimestamp",
                "deletionGracePeriodSeconds")
_OWNED_KINDS = {kind for _, _, _, kind in handlers.OWNED_KINDS}  # what the operator indexes, as it does


@dataclasses.dataclass(frozen=True)
class Write:
    """One request of the operator, as the apiserver saw it."""

    verb: str  # apply, status, create or delete
    kind: str
    namespace: str | None
    name: str  # for a create with generateName, the name given
    code: int  # the HTTP status it got
    body: Body | None
    # When it reached the server and when it was answered, on one counter: requests in flight together overlap.
    started: int = 0
    answered: int = 0

    @property
    def ok(self) -> bool:
        return 200 <= self.code < 300


@dataclasses.dataclass
class _Failure:
    verb: str
    kind: str | None
    name: str | None
    status: int
    times: int

    def matches(self, verb: str, kind: str, name: str) -> bool:
        return self.times > 0 and self.verb == verb and self.kind in (None, kind) and self.name in (None, name)


def _error(status: int, message: str) -> KubeError:
    return KubeError(status, REASONS.get(status, "Unknown"), message)


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge key by key, null removes a key, anything else replaces."""
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, Mapping) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge_patch(out.get(k), v)
    return out


class FakeKube(KubeClient):
    def __init__(self, *, start: datetime.datetime | None = None) -> None:  # no ApiClient: nothing to connect to
        self.objects: dict[Key, Body] = {}
        self.writes: list[Write] = []
        self._failures: list[_Failure] = []
        self._serial = itertools.count(1)
        self._now = start or datetime.datetime(2026, 11, 30, 12, 0, tzinfo=datetime.UTC)
        self._watched: dict[Key, Body] | None = None  # what the paused watches showed when they were paused
        self._paused: frozenset[str] = frozenset()  # the kinds whose watch is paused (empty: all)

    async def close(self) -> None:
        pass

    # --- what the test sees and does -------------------------------------------------------------------------

    def fail(self, verb: str, *, kind: str | None = None, name: str | None = None, status: int,
             times: int = 1) -> None:
        """The next `times` matching writes (verb: apply, status, create or delete) get `status`, and change
        nothing."""
        self._failures.append(_Failure(verb, kind, name, status, times))

    def take_writes(self) -> list[Write]:
        """The writes since the last call, and forgets them."""
        writes, self.writes = self.writes, []
        return writes

    def get(self, kind: str, namespace: str | None, name: str) -> Body | None:
        obj = self.objects.get((kind, namespace, name))
        return copy.deepcopy(obj) if obj is not None else None

    def of_kind(self, kind: str, namespace: str | None = None) -> list[Body]:
        return [copy.deepcopy(o) for (k, ns, _), o in sorted(self.objects.items(), key=lambda i: str(i[0]))
                if k == kind and (namespace is None or ns == namespace)]

    def seed(self, obj: Mapping[str, Any]) -> Body:
        """Creates (or replaces) an object as someone other than the operator would: kubectl, a controller."""
        obj = copy.deepcopy(dict(obj))
        meta = obj["metadata"]
        key = (obj["kind"], meta.get("namespace"), meta["name"])
        old = self.objects.get(key)
        meta.setdefault("uid", old["metadata"]["uid"] if old else self._uid())
        meta.setdefault("creationTimestamp", self._stamp())
        meta.setdefault("generation", 1)
        meta["resourceVersion"] = self._rv()
        self.objects[key] = obj
        return copy.deepcopy(obj)

    def update(self, kind: str, namespace: str | None, name: str, change: Callable[[Body], None]) -> Body:
        """Changes an object in place as someone other than the operator would (kubelet writing a pod's status,
        a user editing a spec); bumps resourceVersion, and generation when more than metadata or status changed."""
        obj = self.objects[(kind, namespace, name)]
        before = copy.deepcopy(obj)
        change(obj)
        if _spec_of(obj) != _spec_of(before):
            obj["metadata"]["generation"] = obj["metadata"].get("generation", 1) + 1
        obj["metadata"]["resourceVersion"] = self._rv()
        return copy.deepcopy(obj)

    def run_pod(self, namespace: str, name: str, *, ip: str, ready: bool = True) -> Body:
        """Kubelet's part: the pod Running at `ip`, Ready or not."""
        status = {"phase": "Running", "podIP": ip,
                  "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}
        return self.update("Pod", namespace, name, lambda o: o.update(status=status))

    def remove(self, kind: str, namespace: str | None, name: str) -> None:
        """The object is gone (and what it owns, as the garbage collector would do)."""
        self._remove((kind, namespace, name))

    def finish_terminating(self) -> list[str]:
        """Kubelet is done with every terminating pod: they go. Returns their names."""
        gone = [key for key, o in self.objects.items() if key[0] == "Pod" and o["metadata"].get("deletionTimestamp")]
        for key in gone:
            self._remove(key)
        return sorted(key[2] for key in gone)

    @contextlib.contextmanager
    def watch_paused(self, *kinds: str) -> Iterator[None]:
        """Inside, `cache()` keeps showing objects of these kinds (all kinds when none is named) as they were
        on entry: their watch lags behind. Each kind has its own watch stream, so one can lag and another not."""
        self._watched = {k: o for k, o in copy.deepcopy(self.objects).items() if not kinds or k[0] in kinds}
        self._paused = frozenset(kinds)
        try:
            yield
        finally:
            self._watched = None

    def cache(self) -> cache_mod.Cache:
        """The operator's cache over this store, as kopf's indices would fill it."""
        return cache_mod.Cache(pools=_Index(self._visible, _pool_entry),
                               owned=[_Index(self._visible, _owned_entry)],
                               routers=_Index(self._visible, _router_entry))

    # --- the apiserver ----------------------------------------------------------------------------------------

    async def request(self, method: str, path: str, *, body: Mapping[str, Any] | None = None,
                      query: Mapping[str, str] | None = None, content_type: str = "application/json",
                      timeout: float = 30) -> Body:
        api_version, kind, namespace, name, sub = _parse(path)
        if method == "GET" and name and sub is None:  # a read: answered, not recorded among the writes
            await asyncio.sleep(0)
            found = self.objects.get((kind, namespace, name))
            if found is None:
                raise _error(404, f'{kind.lower()}s "{name}" not found')
            return copy.deepcopy(found)
        verb = _verb(method, content_type, name, sub)
        if verb == "patch":  # a JSON Patch: a list of operations
            body = {"ops": copy.deepcopy(list(body or ()))}
        else:
            body = copy.deepcopy(dict(body)) if body is not None else None
        target = name or ((body or {}).get("metadata") or {}).get("name") or ""
        started = next(self._serial)
        await asyncio.sleep(0)  # a round trip: requests sent together are in flight together
        try:
            failure = next((f for f in self._failures if f.matches(verb, kind, target)), None)
            if failure is not None:
                failure.times -= 1
                raise _error(failure.status, f"injected failure of {verb} {kind} {target}")
            result = self._handle(verb, api_version, kind, namespace, name, body)
        except KubeError as e:
            self.writes.append(Write(verb, kind, namespace, target, e.status, body, started, next(self._serial)))
            raise
        self.writes.append(Write(verb, kind, namespace, result["metadata"]["name"], 200, body, started,
                                 next(self._serial)))
        return copy.deepcopy(result)

    def _handle(self, verb: str, api_version: str, kind: str, namespace: str | None, name: str | None,
                body: Body | None) -> Body:
        assert body is not None, f"{verb} {kind} without a body"
        if verb == "apply":
            return self._apply(api_version, kind, namespace, str(name), body)
        if verb == "status":
            return self._patch_status(kind, namespace, str(name), body)
        if verb == "create":
            return self._create(api_version, kind, namespace, body)
        if verb == "patch":
            return self._json_patch(kind, namespace, str(name), body["ops"])
        return self._delete(kind, namespace, str(name), body)

    def _json_patch(self, kind: str, namespace: str | None, name: str, ops: list[Body]) -> Body:
        obj = self.objects.get((kind, namespace, name))
        if obj is None:
            raise _error(404, f'{kind} "{name}" not found')
        try:
            patched = spec_change.apply(obj, spec_change.SpecChange(ops=tuple(ops), why="a JSON Patch"))
        except ValueError as e:  # a failed test: the apiserver refuses the whole patch
            raise _error(422, f"the server rejected our request due to an error in our request: {e}") from e
        if _spec_of(patched) != _spec_of(obj):
            patched["metadata"]["generation"] = obj["metadata"].get("generation", 1) + 1
        if patched != obj:
            patched["metadata"]["resourceVersion"] = self._rv()
            self.objects[(kind, namespace, name)] = patched
        return patched

    def _apply(self, api_version: str, kind: str, namespace: str | None, name: str, body: Body) -> Body:
        meta = body.get("metadata") or {}
        if (body.get("apiVersion"), body.get("kind"), meta.get("name"), meta.get("namespace")) != \
                (api_version, kind, name, namespace):
            raise _error(400, f"the body of an apply to {kind} {namespace}/{name} names another object")
        key = (kind, namespace, name)
        old = self.objects.get(key)
        role_ref = body.get("roleRef") or {}
        if kind == "RoleBinding" and ("Role", namespace, role_ref.get("name")) not in self.objects:
            # RBAC's escalation check: the operator may bind only a Role that exists and whose rules it holds.
            raise _error(403, f'rolebindings "{name}" is forbidden: user "pdfleet-operator" is attempting to grant '
                              f"RBAC permissions not currently held (role {role_ref.get('name')} not found)")
        if old is None:
            obj = {k: v for k, v in body.items() if k != "status"}
            obj["metadata"] = {**meta, "uid": self._uid(), "creationTimestamp": self._stamp(), "generation": 1,
                               "resourceVersion": self._rv()}
            self.objects[key] = obj
            return obj
        if meta.get("uid") not in (None, old["metadata"]["uid"]):
            raise _error(409, f"{kind} {name}: the uid in the body is not the object's")
        if kind == "Pod" and body.get("spec") != old.get("spec"):
            raise _error(422, f'Pod "{name}" is invalid: spec: Forbidden: pod updates may not change fields '
                              "other than image, activeDeadlineSeconds, tolerations or "
                              "terminationGracePeriodSeconds")
        # One field manager, forcing: what it applies now is what it owns; server-set fields stay.
        obj = {k: v for k, v in body.items() if k != "status"}
        obj["metadata"] = {**meta, **{k: old["metadata"][k] for k in _SERVER_META if k in old["metadata"]}}
        if "status" in old:
            obj["status"] = old["status"]
        if obj == old:
            return old  # a no-op apply changes nothing, not even the resourceVersion
        if _spec_of(obj) != _spec_of(old):
            obj["metadata"]["generation"] = old["metadata"].get("generation", 1) + 1
        obj["metadata"]["resourceVersion"] = self._rv()
        self.objects[key] = obj
        return obj

    def _patch_status(self, kind: str, namespace: str | None, name: str, body: Body) -> Body:
        obj = self.objects.get((kind, namespace, name))
        if obj is None:
            raise _error(404, f'{kind} "{name}" not found')
        expected = (body.get("metadata") or {}).get("resourceVersion")
        if expected is not None and expected != obj["metadata"]["resourceVersion"]:
            raise _error(409, f'Operation cannot be fulfilled on {kind} "{name}": the object has been modified; '
                              "please apply your changes to the latest version and try again")
        status = merge_patch(obj.get("status"), body.get("status"))
        if status != obj.get("status"):
            obj["status"] = status
            obj["metadata"]["resourceVersion"] = self._rv()
        return obj

    def _create(self, api_version: str, kind: str, namespace: str | None, body: Body) -> Body:
        meta = dict(body.get("metadata") or {})
        if not meta.get("name"):
            if not meta.get("generateName"):
                raise _error(422, f"{kind}: metadata.name or generateName is required")
            meta["name"] = f"{meta['generateName']}{next(self._serial):05x}"
        if (kind, namespace, meta["name"]) in self.objects:
            raise _error(409, f'{kind} "{meta["name"]}" already exists')
        meta.update(namespace=namespace, uid=self._uid(), creationTimestamp=self._stamp(),
                    resourceVersion=self._rv())
        obj = {**body, "apiVersion": api_version, "kind": kind, "metadata": meta}
        self.objects[(kind, namespace, meta["name"])] = obj
        return obj

    def _delete(self, kind: str, namespace: str | None, name: str, body: Body) -> Body:
        key = (kind, namespace, name)
        obj = self.objects.get(key)
        if obj is None:
            raise _error(404, f'{kind} "{name}" not found')
        uid = (body.get("preconditions") or {}).get("uid")
        if uid is not None and uid != obj["metadata"]["uid"]:
            raise _error(409, f"Precondition failed: UID in precondition: {uid}, UID in object meta: "
                              f"{obj['metadata']['uid']}")
        grace = body.get("gracePeriodSeconds", (obj.get("spec") or {}).get("terminationGracePeriodSeconds", 30))
        if kind == "Pod" and grace:
            if not obj["metadata"].get("deletionTimestamp"):
                obj["metadata"].update(deletionTimestamp=self._stamp(), deletionGracePeriodSeconds=grace,
                                       resourceVersion=self._rv())
            return obj
        self._remove(key)
        return obj

    # --- bookkeeping ------------------------------------------------------------------------------------------

    def _remove(self, key: Key) -> None:
        obj = self.objects.pop(key)
        uid = obj["metadata"]["uid"]
        for other in [k for k, o in self.objects.items() if k[1] == key[1] and
                      any(ref.get("uid") == uid for ref in o["metadata"].get("ownerReferences") or [])]:
            if other in self.objects:
                self._remove(other)

    def _visible(self) -> Mapping[Key, Body]:
        if self._watched is None:
            return self.objects
        live = {k: o for k, o in self.objects.items() if self._paused and k[0] not in self._paused}
        return {**live, **self._watched}

    def _rv(self) -> str:
        return str(next(self._serial))

    def _uid(self) -> str:
        return f"uid-{next(self._serial):06d}"

    def _stamp(self) -> str:
        return self._now.strftime("%Y-%m-%dT%H:%M:%SZ")


def _spec_of(obj: Mapping[str, Any]) -> Body:
    return {k: v for k, v in obj.items() if k not in ("metadata", "status")}


def _parse(path: str) -> tuple[str, str, str | None, str | None, str | None]:
    """(apiVersion, kind, namespace, name, subresource) of a request path."""
    parts = [p for p in path.split("?", 1)[0].split("/") if p]
    if parts[:2] == ["api", "v1"]:
        rest = parts[2:]
    else:
        assert parts[:1] == ["apis"], f"not an API path: {path}"
        rest = parts[3:]
    namespace = None
    if rest[:1] == ["namespaces"] and len(rest) > 2:
        namespace, rest = rest[1], rest[2:]
    assert rest and rest[0] in _KINDS, f"the fake knows no resource in {path}"
    api_version, kind = _KINDS[rest[0]]
    return api_version, kind, namespace, (rest[1] if len(rest) > 1 else None), (rest[2] if len(rest) > 2 else None)


def _verb(method: str, content_type: str, name: str | None, sub: str | None) -> str:
    if method == "PATCH" and name and sub is None and content_type == APPLY:
        return "apply"
    if method == "PATCH" and name and sub == "status" and content_type == MERGE:
        return "status"
    if method == "PATCH" and name and sub is None and content_type == JSON_PATCH:
        return "patch"
    if method == "POST" and name is None:
        return "create"
    if method == "DELETE" and name and sub is None:
        return "delete"
    raise AssertionError(f"the fake does not implement {method} {content_type} on {name!r}/{sub!r}")


class _Index(Mapping[cache_mod.PoolKey, list[Body]]):
    """One of kopf's indices, computed from the store each time it is read."""

    def __init__(self, objects: Callable[[], Mapping[Key, Body]],
                 entry: Callable[[Body], Mapping[cache_mod.PoolKey, Body] | None]) -> None:
        self._objects = objects
        self._entry = entry

    def _all(self) -> dict[cache_mod.PoolKey, list[Body]]:
        out: dict[cache_mod.PoolKey, list[Body]] = {}
        for _, obj in sorted(self._objects().items(), key=lambda i: str(i[0])):
            for key, value in (self._entry(obj) or {}).items():
                out.setdefault(key, []).append(value)
        return out

    def __getitem__(self, key: cache_mod.PoolKey) -> list[Body]:
        return self._all()[key]

    def __iter__(self) -> Iterator[cache_mod.PoolKey]:
        return iter(self._all())

    def __len__(self) -> int:
        return len(self._all())


def _labelled(obj: Body, wanted: Mapping[str, str]) -> bool:
    """kopf's label filter on an index."""
    have = obj["metadata"].get("labels") or {}
    return all(have.get(k) == v for k, v in wanted.items())


def _pool_entry(obj: Body) -> Mapping[cache_mod.PoolKey, Body] | None:
    return cache_mod.pool_entry(obj) if obj["kind"] == api_meta.KIND else None


def _owned_entry(obj: Body) -> Mapping[cache_mod.PoolKey, Body] | None:
    if obj["kind"] not in _OWNED_KINDS or not _labelled(obj, handlers.MANAGED):
        return None
    return cache_mod.owned_entry(obj["apiVersion"], obj["kind"], obj)


def _router_entry(obj: Body) -> Mapping[cache_mod.PoolKey, Body] | None:
    router = {**handlers.MANAGED, labels.COMPONENT: ROUTER_COMPONENT}
    return cache_mod.router_entry(obj) if obj["kind"] == "Pod" and _labelled(obj, router) else None
