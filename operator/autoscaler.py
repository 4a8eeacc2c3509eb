"""Runs `spec.autoscaling` after every health poll of a pool: reads what the poll saw (the verdicts, the pods, each
autoscaled role's leaders' load from the monitor), asks `planning.scale.autoscale` (pure) what each role should run, and
writes it.

- A scale is written into the pool's `spec.<role>.replicas` with the JSON Patch guarded by the pool's generation
  that the role scaler uses (`kube.pool_patch`): a decision about a spec someone changed meanwhile is refused by
  the apiserver and decided again at the next poll. The reconcile then adds or removes groups as for any replica
  change (a scale during a rollout keeps the rollout); an InferencePoolRole of a role the band moved is kept in
  step by the role scaler, which takes the pool's new number as an edit of the pool. A `ScaledUp` or `ScaledDown`
  Event says what was read and which rule fired.
- `status.autoscaling` is merge-patched (only that field; the planner carries it over unchanged) when a role's
  decision says something new: a scale at once, a changed rule, size or recommendation at most every
  STATUS_PAUSE seconds. The values read change at every poll and alone are never written.
- Until the watch shows this process's own writes, it decides from what it wrote (the status it last decided;
  no decision at all while the pool's generation is behind its own patch), as the role scaler does.
- The watch event of its own status write is no news to the reconcile (the planner carries status.autoscaling over
  and reads nothing else of it): `wrote` tells the pool's event handler so, and that event queues no reconcile.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from prometheus_client import Gauge
from pydantic import ValidationError

from pdfleet.operator import metrics
from pdfleet.operator.api import meta as api_meta
from pdfleet.operator.api.autoscaling import AutoscalingRoleStatus, AutoscalingStatus
from pdfleet.operator.api.roles import Role
from pdfleet.operator.api.spec import InferencePoolSpec
from pdfleet.operator.cache import Observed, PoolKey
from pdfleet.operator.kube import api_paths, pool_patch
from pdfleet.operator.kube.kube_client import KubeClient, KubeError
from pdfleet.operator.planning import spec_change
from pdfleet.operator.planning.groups import leader_pod, pods_by_group
from pdfleet.operator.planning.health.rank_health import GroupHealth
from pdfleet.operator.planning.plan import Event
from pdfleet.operator.planning.renders import Renders
from pdfleet.operator.planning.scale import autoscale, engine_load, serving_groups
from pdfleet.operator.planning.scale.autoscale import Decision, RoleInput
from pdfleet.operator.planning.scale.engine_load import EngineLoad, LoadSample
from pdfleet.operator.render import revision

log = logging.getLogger(__name__)

Body = dict[str, Any]
STATUS_PAUSE = 10.0  # seconds between status writes of a pool that only record a new recommendation or rule
MERGE_PATCH = "application/merge-patch+json"
SECONDS = {autoscale.Rule.TTFT, autoscale.Rule.ITL}  # readings in ms, exported in seconds

PostEvent = Callable[[Mapping[str, Any], Event], Any]


def _generation(pool: Mapping[str, Any]) -> int:
    return int((pool.get("metadata") or {}).get("generation") or 0)


class Autoscaler:
    def __init__(self, *, client: KubeClient, loads: Callable[[PoolKey], Mapping[str, LoadSample]],
                 post_event: PostEvent, renders: Renders | None = None,
                 clock: Callable[[], datetime.datetime] | None = None,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self._client = client
        self._loads = loads
        self._post_event = post_event
        self._renders = renders if renders is not None else Renders()  # the status parsed once, shared
        self._clock = clock or (lambda: datetime.datetime.now(datetime.UTC))
        self._monotonic = monotonic
        self._samples: dict[PoolKey, dict[str, LoadSample]] = {}  # each leader's last sample, by pod uid
        self._decided: dict[PoolKey, AutoscalingStatus] = {}  # the status as last decided (written or not)
        self._written: dict[PoolKey, tuple[AutoscalingStatus, float]] = {}  # as last written, and when
        self._patched: dict[PoolKey, int] = {}  # the generation our last spec patch made
        self._exported: dict[PoolKey, set[tuple[Gauge, tuple[str, ...]]]] = {}  # label sets set, to remove
        self._cleared: set[PoolKey] = set()  # pools whose status.autoscaling this process removed
        # The resourceVersion our last status write left each pool at, when that write changed nothing but
        # status.autoscaling of the pool it was decided on (`wrote`).
        self._echoes: dict[PoolKey, str] = {}

    def forget(self, key: PoolKey) -> None:
        self._samples.pop(key, None)
        self._decided.pop(key, None)
        self._written.pop(key, None)
        self._patched.pop(key, None)
        self._cleared.discard(key)
        self._echoes.pop(key, None)
        for gauge, labels in self._exported.pop(key, set()):
            with contextlib.suppress(KeyError):
                gauge.remove(*labels)

    def wrote(self, key: PoolKey, resource_version: str | None) -> bool:
        """Whether `resource_version` is the pool as this process's last status.autoscaling write left it, that write
        having changed nothing else of the pool it was decided on: the watch event of it is the echo of our own
        write, with nothing in it a reconcile plans from (each one was a reconcile that wrote nothing)."""
        return resource_version is not None and self._echoes.get(key) == resource_version

    async def after_poll(self, key: PoolKey, spec: InferencePoolSpec, observed: Observed,
                         judged: Mapping[str, GroupHealth]) -> None:
        pool = observed.pool
        if pool is None or pool["metadata"].get("deletionTimestamp"):
            return
        if spec.paused or all(spec.autoscaling.role(role) is None for role in Role):
            if key in self._decided:
                self.forget(key)
            if not spec.paused and (pool.get("status") or {}).get("autoscaling") is not None and \
                    key not in self._cleared and await self._patch_status(key, pool, None):
                self._cleared.add(key)  # switched off: its decisions are no longer true; said once
            return
        self._cleared.discard(key)
        if _generation(pool) < self._patched.get(key, 0):
            return  # the watch has not shown our last scale yet: deciding from the old replicas would repeat it
        now = self._clock()
        inputs = self._inputs(key, spec, pool, observed, judged)
        decisions = autoscale.decide(inputs, spec.scaling.ratio, now)
        scaled = {role: d for role, d in decisions.items() if d.desired != d.replicas}
        wrote_scale = False
        if scaled:
            wrote_scale = await self._scale(key, pool, scaled)
            if not wrote_scale:
                return  # refused for a stale generation: decided again at the next poll
        statuses = self._decided.get(key) or _pool_status(pool)
        for role in Role:
            if spec.autoscaling.role(role) is None:  # no longer autoscaled: what was said of it is not true now
                statuses = _with(statuses, role, None)
        for role, d in decisions.items():
            if d.status is not None:
                status = autoscale.scaled(d.status, now) if role in scaled else d.status
                statuses = _with(statuses, role, status)
            self._export(key, d)
        self._decided[key] = statuses
        await self._write_status(key, pool, statuses, urgent=wrote_scale)

    def _inputs(self, key: PoolKey, spec: InferencePoolSpec, pool: Mapping[str, Any], observed: Observed,
                judged: Mapping[str, GroupHealth]) -> dict[Role, RoleInput]:
        pods = pods_by_group(observed.of_kind("Pod"))
        groups = self._renders.previous(pool).groups
        decided = self._decided.get(key) or _pool_status(pool)
        loads = self._loads(key)
        seen = self._samples.setdefault(key, {})
        verdicts = {name: health.verdict for name, health in judged.items()}
        out: dict[Role, RoleInput] = {}
        kept: dict[str, LoadSample] = {}
        for role in Role:
            role_spec = spec.role(role)
            counted = serving_groups.serving(role, replicas=role_spec.replicas, nodes=role_spec.nodes_per_group,
                                             revision=revision.role_revision(spec, role), pods=pods,
                                             verdicts=verdicts, statuses=groups)
            windows: list[EngineLoad] = []
            for name in counted.groups:
                sample = loads.get(name)
                head = leader_pod(pods.get(name, []))
                if sample is None or head is None or sample.pod != head["metadata"].get("uid"):
                    continue
                windows.append(engine_load.window(seen.get(sample.pod), sample))
                kept[sample.pod] = sample
            out[role] = RoleInput(replicas=role_spec.replicas, serving=len(counted.groups),
                                  all_serving=counted.all_serving, loads=tuple(windows),
                                  scaling=spec.autoscaling.role(role), status=decided.role(role))
        self._samples[key] = kept  # only the engines that count now: the memory stays as small as the fleet
        return out

    async def _scale(self, key: PoolKey, pool: Mapping[str, Any], scaled: Mapping[Role, Decision]) -> bool:
        said = ", ".join(f"{role} {d.replicas} -> {d.desired} ({d.rule})" for role, d in scaled.items())
        change = spec_change.patch(pool, {("spec", str(role), "replicas"): d.desired for role, d in scaled.items()},
                                   why=f"spec.autoscaling: {said}")
        if change is None:
            return False
        try:
            stored = await pool_patch.patch_pool(self._client, pool, change)
        except KubeError as e:
            log.warning("%s/%s: could not write the autoscaler's scale (%s): %s", *key, said, e)
            return False
        if stored is None:
            log.info("%s/%s: not scaled, its spec moved on: %s", *key, said)
            return False
        self._patched[key] = _generation(stored)
        log.info("%s/%s autoscaled: %s", *key, said, extra={"namespace": key[0], "pool": key[1]})
        for role, d in scaled.items():
            direction = d.direction or "up"
            metrics.AUTOSCALER_DECISIONS.labels(role=str(role), direction=direction, rule=d.rule).inc()
            reason = "ScaledUp" if direction == "up" else "ScaledDown"
            try:
                await self._post_event({**pool, "apiVersion": api_meta.API_VERSION, "kind": api_meta.KIND},
                                       Event("Normal", reason, d.message))
            except Exception:  # an Event is news, not state
                log.exception("%s/%s: could not post %s", *key, reason)
        return True

    def _export(self, key: PoolKey, d: Decision) -> None:
        exported = self._exported.setdefault(key, set())

        def put(gauge: Gauge, labels: tuple[str, ...], value: float) -> None:
            gauge.labels(*labels).set(value)
            exported.add((gauge, labels))

        labels = (key[0], key[1], str(d.role))
        put(metrics.AUTOSCALER_DESIRED, labels, d.desired)
        if d.status is not None:
            put(metrics.AUTOSCALER_SERVING, labels, d.status.current)
        for reading in d.readings:
            put(metrics.AUTOSCALER_METRIC, (*labels, reading.rule),
                reading.value / 1000 if reading.rule in SECONDS else reading.value)

    async def _write_status(self, key: PoolKey, pool: Mapping[str, Any], statuses: AutoscalingStatus, *,
                            urgent: bool) -> None:
        last, at = self._written.get(key, (_pool_status(pool), -STATUS_PAUSE))
        if not any(autoscale.worth_writing(last.role(role), statuses.role(role)) for role in Role):
            return
        if not urgent and self._monotonic() - at < STATUS_PAUSE:
            return  # kept in memory meanwhile (decisions read it), written at a later poll
        if await self._patch_status(key, pool, statuses):
            self._written[key] = (statuses, self._monotonic())

    async def _patch_status(self, key: PoolKey, pool: Mapping[str, Any], statuses: AutoscalingStatus | None) -> bool:
        """A merge patch of status.autoscaling alone (a role no longer autoscaled, or all of it, as null: a merge
        patch keeps what it does not name). Unguarded by the resourceVersion: no other writer sets it, and the
        planner's own status writes, which carry it over, are guarded by theirs."""
        value = None if statuses is None else {str(role): None if (s := statuses.role(role)) is None
                                               else s.model_dump(mode="json") for role in Role}
        try:
            stored = await self._client.request("PATCH", api_paths.object_path(pool) + "/status",
                                                body={"status": {"autoscaling": value}}, content_type=MERGE_PATCH)
        except KubeError as e:
            log.warning("%s/%s: could not write status.autoscaling: %s", *key, e)
            return False
        # Unguarded, the patch may have landed on a pool someone changed since `pool` was read: its event is then
        # news (it carries that change), and only an echo of status.autoscaling alone is registered as ours.
        if isinstance(stored, dict) and _only_autoscaling_moved(pool, stored):
            self._echoes[key] = stored["metadata"]["resourceVersion"]
        else:
            self._echoes.pop(key, None)
        return True


_VOLATILE_META = {"resourceVersion", "managedFields"}  # what any write moves, or the cache does not keep
_NOT_COMPARED = {"metadata", "status", "apiVersion", "kind"}  # (a listed pool's entry has no type of its own)


def _only_autoscaling_moved(read: Mapping[str, Any], stored: Mapping[str, Any]) -> bool:
    """Whether `stored` (the pool as a status.autoscaling patch left it) is `read` (the pool the patch was decided
    on) with only status.autoscaling and its resourceVersion changed."""
    def rest(pool: Mapping[str, Any]) -> tuple[Any, ...]:
        meta = {k: v for k, v in (pool.get("metadata") or {}).items() if k not in _VOLATILE_META}
        status = {k: v for k, v in (pool.get("status") or {}).items() if k != "autoscaling"}
        others = {k: v for k, v in pool.items() if k not in _NOT_COMPARED}
        return meta, status, others
    return bool((stored.get("metadata") or {}).get("resourceVersion")) and rest(read) == rest(stored)


def _pool_status(pool: Mapping[str, Any]) -> AutoscalingStatus:
    raw = (pool.get("status") or {}).get("autoscaling")
    try:
        return AutoscalingStatus.model_validate(raw or {})
    except ValidationError:
        return AutoscalingStatus()


def _with(statuses: AutoscalingStatus, role: Role, status: AutoscalingRoleStatus | None) -> AutoscalingStatus:
    return statuses.model_copy(update={str(role): status})
