"""Polls the rank-health agents of every pool's engine groups and keeps what it judged for the planner.

One task per pool, started when the pool is seen (`watch`) and ended when it is gone (`forget`, or the pool
vanishing from the cache: the task checks every period, so it is level-based and cannot outlive its pool).
Each period it reads the pool and its pods from the cache (no API reads), asks the agents of every group
whose pods are all Ready (`client.EngineClient`, bounded and with short timeouts), judges each group
(`planning.health.rank_health`, pure) and stores the result. Only when a verdict changes does it poke the pool's
reconcile; the reconcile turns the stored verdicts into status, conditions and events like any other input.
So an unchanged verdict costs one HTTP round trip per pod per period and no API call at all.

For the verification gates it also fetches, once per pod (by uid), `/server_info` of the leader engine of every
group that runs its role's update revision with all pods Ready (through the same client), and hands the
planner `EngineFacts` per group: which pods the poll judged, and what their /server_info showed. With the
toolCallCanary gate on, it starts the tool-call canary at each such decode group's leader, paired with a Ready
prefill leader (`canary_gate.CanaryRunner`: once per pod, as a task; the finding comes with a later poll, which
the run's end wakes). While a new revision rolls out with a bake, it also reads `/metrics` of every group's
leader, old revision and new, at every poll: the counters a bake compares (`EngineFacts.metrics`); a baking
group that has served too few requests to be judged gets plain probe requests from the operator
(`bake_probes.BakeProber`). With `spec.autoscaling`, the same GET of an autoscaled role's leaders' /metrics gives
their load (`loads`), which the autoscaler reads after the poll (`after_poll`).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from pdfleet.operator import metrics
from pdfleet.operator.api.roles import Role
from pdfleet.operator.api.scalars import parse_duration
from pdfleet.operator.api.spec import InferencePoolSpec
from pdfleet.operator.api.status import InferencePoolStatus, ServingSample, Verdict
from pdfleet.operator.cache import Cache, Observed, PoolKey
from pdfleet.operator.engines import canary_runner
from pdfleet.operator.engines.bake_probes import BakeProber, Pair, probe
from pdfleet.operator.engines.canary_runner import CanaryRunner
from pdfleet.operator.engines.engine_client import EngineClient
from pdfleet.operator.planning.groups import leader_pod, pods_by_group
from pdfleet.operator.planning.health import engine_reads, rank_health
from pdfleet.operator.planning.health.rank_health import GroupHealth
from pdfleet.operator.planning.renders import Renders
from pdfleet.operator.planning.rollout import bake, canary_gate
from pdfleet.operator.planning.rollout.verification import EngineFacts
from pdfleet.operator.planning.router import router_membership
from pdfleet.operator.planning.scale.engine_load import LoadSample, Work

log = logging.getLogger(__name__)

Body = dict[str, Any]
IDLE_PERIOD = 5.0  # seconds between looks at a pool whose spec cannot be read (it may be fixed)
MAX_AGENT_TIMEOUT = 2.0  # seconds one agent may take; a live agent answers in milliseconds
DETECTED = (Verdict.DESYNC, Verdict.HANG)  # verdicts whose time to detect is measured


# Runs after every poll of a pool with what was judged (the routers' membership follows the verdicts).
AfterPoll = Callable[[PoolKey, InferencePoolSpec, Observed, Mapping[str, GroupHealth]], Awaitable[None]]


class HealthMonitor:
    def __init__(self, *, cache: Cache, engines: EngineClient, poke: Callable[[PoolKey], None],
                 after_poll: AfterPoll | None = None, canary: CanaryRunner | None = None,
                 prober: BakeProber | None = None, renders: Renders | None = None) -> None:
        self._cache = cache
        # The spec validated and the status parsed once per generation and status, shared with the planner's
        # reconciles: a poll of every pool each heartbeat validated its spec again (and a new spec object missed
        # the revision memo: most of a poll's CPU in the operator benchmark).
        self._renders = renders if renders is not None else Renders()
        self._engines = engines  # not ours to close: the operator's one client, shared
        self._canary = canary  # made on first use, inside the event loop
        self._prober = prober  # the same
        self._facts: dict[PoolKey, dict[str, EngineFacts]] = {}
        self._infos: dict[PoolKey, dict[str, Mapping[str, Any]]] = {}  # /server_info by pod uid
        self._loads: dict[PoolKey, dict[str, LoadSample]] = {}  # autoscaled roles' leaders' load, by group
        self._asked: dict[PoolKey, frozenset[str]] = {}  # the groups whose load the last poll asked for
        self._poke = poke
        self.after_poll = after_poll
        self._judged: dict[PoolKey, dict[str, GroupHealth]] = {}
        self._answered: dict[PoolKey, set[str]] = {}  # uids of pods whose agent has answered at least once
        self._warned: dict[PoolKey, set[str]] = {}  # uids of pods whose address answered with other pods' ranks
        self._foreign: dict[PoolKey, set[str]] = {}  # the same, in the last poll
        self._tasks: dict[PoolKey, asyncio.Task[None]] = {}
        self._wake: dict[PoolKey, asyncio.Event] = {}

    def health(self, key: PoolKey) -> Mapping[str, GroupHealth]:
        """What was last judged of the pool's groups, by group name (empty before the first poll)."""
        return dict(self._judged.get(key, {}))

    def facts(self, key: PoolKey) -> Mapping[str, EngineFacts]:
        """What the last poll saw of the pool's groups' engines for verification, by group name."""
        return dict(self._facts.get(key, {}))

    def loads(self, key: PoolKey) -> Mapping[str, LoadSample]:
        """The load the last poll read from each group's leader, by group name, for the roles `spec.autoscaling`
        sizes (kept apart from the facts: a load changes at every poll and must not wake the reconcile)."""
        return dict(self._loads.get(key, {}))

    def work(self, key: PoolKey) -> Work:
        """The same loads for the planner's choice of the group a scale-down removes, with the groups asked."""
        return Work(loads=dict(self._loads.get(key, {})), asked=self._asked.get(key, frozenset()))

    def watch(self, key: PoolKey) -> None:
        """Polls the pool from now on, if it is not polled already."""
        task = self._tasks.get(key)
        if task is None or task.done():
            self._tasks[key] = asyncio.create_task(self._run(key), name=f"rank-health {key[0]}/{key[1]}")

    def nudge(self, key: PoolKey) -> None:
        """Polls the pool now instead of at the end of its period: its pods changed (one became Ready, say),
        and a verdict that waits a whole heartbeat would be written separately from the pod change."""
        wake = self._wake.get(key)
        if wake is not None:
            wake.set()

    def forget(self, key: PoolKey) -> None:
        self._wake.pop(key, None)
        task = self._tasks.pop(key, None)
        if task is not None:
            task.cancel()
        self._drop(key)

    def _drop(self, key: PoolKey) -> None:
        """Everything kept about the pool's groups and pods."""
        for kept in (self._judged, self._answered, self._warned, self._foreign, self._facts, self._infos,
                     self._loads, self._asked):
            kept.pop(key, None)
        if self._canary is not None:
            self._canary.forget(key)
        if self._prober is not None:
            self._prober.forget(key)

    async def close(self) -> None:
        tasks = list(self._tasks.values())
        for key in list(self._tasks):
            self.forget(key)
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self._canary is not None:
            await self._canary.close()
        if self._prober is not None:
            await self._prober.close()

    async def _run(self, key: PoolKey) -> None:
        wake = self._wake.setdefault(key, asyncio.Event())
        while True:
            started = time.monotonic()
            wake.clear()
            try:
                period = await self.poll(key)
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug in one poll must not end the pool's health checks for good
                log.exception("rank-health poll of %s/%s failed", *key)
                period = IDLE_PERIOD
            if period is None:  # the pool is gone
                self._tasks.pop(key, None)
                self._wake.pop(key, None)
                self._drop(key)
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), timeout=max(0.0, started + period - time.monotonic()))

    async def poll(self, key: PoolKey) -> float | None:
        """One round over the pool's groups. Returns the seconds until the next, None when the pool is gone."""
        observed = self._cache.snapshot(key)
        pool = observed.pool
        if pool is None or pool["metadata"].get("deletionTimestamp"):
            return None
        spec, problems = self._renders.validated(pool)
        if spec is None or problems:
            return IDLE_PERIOD
        period = parse_duration(spec.health.heartbeat_period).total_seconds()
        last = self._renders.previous(pool)  # what the planner last wrote: read once per poll
        judged, judged_pods = await self._judge(key, spec, observed, last, timeout=min(MAX_AGENT_TIMEOUT, period))
        asked_before = self._asked.get(key, frozenset())
        facts = await self._engine_facts(key, spec, judged_pods, last, routers=observed.routers)
        if self._asked.get(key, frozenset()) - asked_before:
            self._poke(key)  # a scale-down may be waiting for these loads to choose its group (planning/scale/ordinals)
        before = self._judged.get(key)
        facts_before = self._facts.get(key)
        self._judged[key] = judged
        self._facts[key] = facts
        # New engine facts (a /server_info fetched, other pods judged) give the gates something new to judge.
        if facts != facts_before or before is None or before.keys() != judged.keys() or \
                any(not judged[name].same_as(before[name]) for name in judged):
            changed = [f"{n} {h.verdict}" for n, h in judged.items() if not h.same_as((before or {}).get(n))]
            for name, health in judged.items():
                was = (before or {}).get(name)
                if health.verdict in DETECTED and (was is None or was.verdict is not health.verdict):
                    metrics.DETECTION.labels(verdict=str(health.verdict)).observe(health.held_seconds)
            if changed:
                log.info("rank health of %s/%s: %s", *key, ", ".join(changed),
                         extra={"namespace": key[0], "pool": key[1]})
            self._poke(key)
        if self.after_poll is not None:
            try:
                await self.after_poll(key, spec, observed, judged)
            except asyncio.CancelledError:
                raise
            except Exception:  # routers are best effort: rank health must go on whatever they do
                log.exception("after the rank-health poll of %s/%s", *key)
        return period

    async def _engine_facts(self, key: PoolKey, spec: InferencePoolSpec, judged_pods: Mapping[str, list[Body]],
                            last: InferencePoolStatus, *, routers: Sequence[Body] = ()) -> dict[str, EngineFacts]:
        """Each judged group's facts, from the reads `engine_reads` decides (its docstring says which). The canary
        goes to the decode leaders it names, so that a restarted operator sends none into verified engines. While
        sampling, what the pool's `routers` saw of each sampled engine is added to its counters."""
        infos = self._infos.setdefault(key, {})
        reads = engine_reads.engine_reads(spec, judged_pods, last, known=infos.keys(),
                                          foreign=self._foreign.get(key, set()))
        for leader in reads.canary:
            self._start_canary(key, spec, leader, judged_pods)
        samples, loads = await self._read(reads, infos, routers) if reads.any else ({}, {})
        self._loads[key] = loads
        self._asked[key] = reads.asked
        if engine_reads.sampling(spec, last):
            self._probe_thin_bakes(key, spec, judged_pods, samples, last)
        alive = {p["metadata"].get("uid") for pods in judged_pods.values() for p in pods}
        found = self._canary.findings(key, {str(u) for u in alive}) if self._canary is not None else {}
        facts = {}
        for name, pods in judged_pods.items():
            uids = {p["metadata"].get("uid") for p in rank_health.live_pods(pods)} - {None}
            facts[name] = EngineFacts(pods=frozenset(str(u) for u in uids),
                                      server_info={u: infos[u] for u in uids if u in infos},
                                      canary={u: found[u] for u in uids if u in found},
                                      metrics={u: samples[u] for u in uids if u in samples})
        for uid in set(infos) - alive:  # forget pods that are gone, so the memory stays as small as the fleet
            del infos[uid]
        return facts

    async def _read(self, reads: engine_reads.EngineReads, infos: dict[str, Any], routers: Sequence[Body]
                    ) -> tuple[dict[str, ServingSample], dict[str, LoadSample]]:
        """Does `reads`: /server_info into `infos`, one /metrics per leader, and (while sampling) what each router
        saw; returns the bake samples by pod uid and the loads by group."""
        engines = self._engines
        serving = [r for r in routers if reads.sampled and not r["metadata"].get("deletionTimestamp")]
        read = reads.metrics()
        got, counted, seen = await asyncio.gather(
            asyncio.gather(*(engines.server_info(pod, port) for pod, port in reads.server_info)),
            asyncio.gather(*(engines.engine_metrics(pod, port) for pod, port in read.values())),
            asyncio.gather(*(engines.routed(router) for router in serving)))
        for (pod, _), info in zip(reads.server_info, got, strict=True):
            if info is not None:
                infos[pod["metadata"]["uid"]] = info
        outcomes = [s for s in seen if s is not None]
        by_uid = dict(zip(read, counted, strict=True))
        samples: dict[str, ServingSample] = {}
        for pod, port in reads.sampled:
            sample = by_uid[str(pod["metadata"]["uid"])].serving
            ip = router_membership.pod_ip(pod)
            if sample is not None and ip is not None:
                samples[sample.pod] = bake.with_routed(sample, outcomes, router_membership.worker_url(ip, port))
        loads = {name: load for name, (pod, _) in reads.loaded.items()
                 if (load := by_uid[str(pod["metadata"]["uid"])].load) is not None}
        return samples, loads

    def _probe_thin_bakes(self, key: PoolKey, spec: InferencePoolSpec, judged_pods: Mapping[str, list[Body]],
                          samples: Mapping[str, ServingSample], last: InferencePoolStatus) -> None:
        """Probe requests for each baking group that has served too few requests to be judged yet."""
        now = datetime.datetime.now(datetime.UTC)
        for group in last.groups:
            record = bake.baking(group)
            needed = bake.shortfall(spec.rollout.verification, record, samples, now) if record is not None else 0
            if needed <= 0:
                continue
            head = leader_pod(rank_health.live_pods(judged_pods.get(group.name, [])))
            other = Role.PREFILL if group.role is Role.DECODE else Role.DECODE
            partner = canary_gate.pick_prefill(judged_pods.values(), other)
            if head is None or partner is None:
                continue
            prefill, decode = (partner, head) if group.role is Role.DECODE else (head, partner)
            prefill_ip, decode_ip = router_membership.pod_ip(prefill), router_membership.pod_ip(decode)
            if prefill_ip is None or decode_ip is None:
                continue
            if self._prober is None:
                self._prober = BakeProber(run=functools.partial(probe, self._engines))
            self._prober.ensure(key, Pair(group=group.name, prefill_ip=prefill_ip, prefill_port=spec.prefill.port,
                                          bootstrap_port=spec.prefill.bootstrap_port, decode_ip=decode_ip,
                                          decode_port=spec.decode.port, model=spec.model.served_name), needed)

    def _start_canary(self, key: PoolKey, spec: InferencePoolSpec, leader: Body,
                      judged_pods: Mapping[str, list[Body]]) -> None:
        prefill = canary_gate.pick_prefill(judged_pods.values())
        target = canary_runner.target(spec, leader, prefill) if prefill is not None else None
        if target is None:
            return  # no Ready prefill engine to pair with yet: the gate waits
        if self._canary is None:
            engines = self._engines
            self._canary = CanaryRunner(
                done=self.nudge, run=lambda target: asyncio.ensure_future(canary_runner.run_once(engines, target)))
        self._canary.ensure(key, target)

    def _own(self, key: PoolKey, pods: list[Body], answers: rank_health.Answers,
             moment: datetime.datetime) -> rank_health.Answers:
        own = rank_health.own_answers(pods, answers, now=moment)
        for pod in _foreign(pods, answers, own):
            uid = str(pod["metadata"].get("uid"))
            self._foreign.setdefault(key, set()).add(uid)
            warned = self._warned.setdefault(key, set())
            if uid not in warned:  # once per pod: it lasts until the other pod's processes are gone
                warned.add(uid)
                log.warning("%s/%s: the agent at pod %s's address reports ranks older than the pod: not taken for "
                            "its own (another pod's processes still hold its address?)", *key, pod["metadata"]["name"],
                            extra={"namespace": key[0], "pool": key[1]})
        return own

    async def _judge(self, key: PoolKey, spec: InferencePoolSpec, observed: Observed, last: InferencePoolStatus,
                     *, timeout: float) -> tuple[dict[str, GroupHealth], dict[str, list[Body]]]:
        previous = {g.name: g.verdict for g in last.groups}
        answered = self._answered.setdefault(key, set())
        groups = sorted(pods_by_group(observed.of_kind("Pod")).items())

        async def ask(pods: list[Body]) -> rank_health.Answers:
            role = engine_reads.role_of(pods)
            if role is None or not rank_health.pollable(pods, nodes=spec.role(role).nodes_per_group):
                return {}
            return await self._engines.ranks_all(rank_health.live_pods(pods), timeout=timeout)

        asked = await asyncio.gather(*(ask(pods) for _, pods in groups))
        # The pods again, as they are now that the agents answered: a pod deleted meanwhile (drained, replaced,
        # restarted) takes its ranks down, and their exits or silence are that stop, not a sickness.
        now = pods_by_group(self._cache.snapshot(key).of_kind("Pod"))
        moment = datetime.datetime.now(datetime.UTC)  # after every answer came: see rank_health.own_answers
        self._foreign[key] = set()
        results: dict[str, GroupHealth] = {}
        judged_pods: dict[str, list[Body]] = {}
        for (name, pods), answers in zip(groups, asked, strict=True):
            role = engine_reads.role_of(pods)
            if role is None or name not in now:
                continue
            if _uids(now[name]) != _uids(pods):  # replaced while asked: these answers are not about its pods
                pods, answers = now[name], {}
            elif rank_health.terminating(now[name]):
                pods = now[name]
            answers = self._own(key, pods, answers, moment)
            role_spec = spec.role(role)
            uids = _uids(rank_health.live_pods(pods))
            answered.update(p["metadata"].get("uid") for p in rank_health.live_pods(pods)
                            if answers.get(p["metadata"]["name"]))
            before = previous.get(name, Verdict.UNKNOWN) is not Verdict.UNKNOWN or bool(uids & answered)
            judged_pods[name] = pods
            results[name] = rank_health.judge_group(
                spec.health, tp=role_spec.tp, gpus_per_node=role_spec.gpus_per_node,
                nodes=role_spec.nodes_per_group, pods=pods, answers=answers, answered_before=before)
        # Forget pods that are gone, so the memory stays as small as the fleet.
        alive = {p["metadata"].get("uid") for _, pods in groups for p in pods}
        answered.intersection_update(alive)
        self._warned.get(key, set()).intersection_update(alive)
        return results, judged_pods


def _foreign(pods: list[Body], answers: rank_health.Answers, own: rank_health.Answers) -> list[Body]:
    """The pods whose answer lost ranks to `own_answers`."""
    return [p for p in pods if answers.get(p["metadata"]["name"]) is not own.get(p["metadata"]["name"])]


def _uids(pods: list[Body]) -> set[str | None]:
    return {p["metadata"].get("uid") for p in pods}


