"""What a reconcile derives from the pool's spec and status alone, kept between reconciles of the same pool.

Most reconciles of a pool see a spec they have seen before: its own pods' and status writes' echoes, health
verdicts, resyncs. Validating the spec, rendering every object with its content hash and parsing the previous
status were two thirds of such a plan (docs/operator-throughput.md). `Renders` keeps them per pool:

- the typed spec and its problems, its patch set resolved (`patch_set`, with the pool's status: the one input
  there that is not the spec), and the rendered objects (per render context and groups' ordinals), for the
  pool's uid and generation, used only while the spec is equal to the one they were made from: a client that
  edits a spec without a new generation (a test, a stale cache) gets a fresh render, never a stale one;
- the previous status, parsed, used only while the pool's raw status is equal to it.

Deterministic memoisation of pure functions: a plan made with a `Renders` is the plan made without one. No I/O,
no clock. The executor holds one per operator and forgets a pool when the pool goes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from pdfleet.operator.api import checks
from pdfleet.operator.api.roles import Role
from pdfleet.operator.api.spec import InferencePoolSpec
from pdfleet.operator.api.status import InferencePoolStatus
from pdfleet.operator.cache import json_copy
from pdfleet.operator.planning import patch_set, status_writes
from pdfleet.operator.render.context import RenderContext
from pdfleet.operator.render.desired import Desired, Ordinals, desired

Body = dict[str, Any]
PoolId = tuple[str, str, str]  # namespace, name, uid
DESIRED_KEPT = 4  # renders kept per generation: the slots a rollout or a scale moves through, at most a few


@dataclasses.dataclass
class _Spec:
    generation: int | None
    raw: Any  # a copy of the spec it was made from: the client's dict may be edited in place
    spec: InferencePoolSpec | None
    problems: tuple[checks.Problem, ...]
    desired: dict[tuple[RenderContext, tuple[tuple[Role, Ordinals], ...]], Desired] = dataclasses.field(
        default_factory=dict)
    resolved: tuple[Any, patch_set.Resolution] | None = None  # what the resolution read of the status, and it


@dataclasses.dataclass
class _Status:
    raw: Any  # a copy of the raw status
    parsed: InferencePoolStatus


@dataclasses.dataclass
class Counts:
    """Hits and misses, for tests and the profile."""

    spec_hits: int = 0
    spec_misses: int = 0
    desired_hits: int = 0
    desired_misses: int = 0
    status_hits: int = 0
    status_misses: int = 0


class Renders:
    def __init__(self) -> None:
        self._specs: dict[PoolId, _Spec] = {}
        self._statuses: dict[PoolId, _Status] = {}
        self.counts = Counts()

    def forget(self, namespace: str, name: str) -> None:
        """Drops what is kept of the pool (every uid it had)."""
        for kept in (self._specs, self._statuses):
            for pid in [p for p in kept if p[:2] == (namespace, name)]:
                del kept[pid]

    def __len__(self) -> int:
        return len(self._specs)

    def validated(self, pool: Mapping[str, Any]) -> tuple[InferencePoolSpec | None, list[checks.Problem]]:
        """`checks.validate_pool(pool)`, its spec with the patch set resolved (`patch_set.resolve`)."""
        entry = self._spec_entry(pool)
        resolution = self._resolution(pool, entry)
        return (resolution.spec if resolution is not None else entry.spec), list(entry.problems)

    def patches(self, pool: Mapping[str, Any]) -> patch_set.Resolution | None:
        """How the spec `validated(pool)` returned got its patch set; None for a spec that does not parse."""
        return self._resolution(pool, self._spec_entry(pool))

    def _resolution(self, pool: Mapping[str, Any], entry: _Spec) -> patch_set.Resolution | None:
        if entry.spec is None:
            return None
        previous = self.previous(pool)
        key = (previous.patches, previous.update_revision)
        if entry.resolved is None or entry.resolved[0] != key:
            resolution = patch_set.resolve(entry.spec, previous)
            if entry.resolved is not None and resolution.spec == entry.resolved[1].spec:
                # The same set (a new update revision, say): the spec object the renders kept are keyed by stays.
                resolution = dataclasses.replace(resolution, spec=entry.resolved[1].spec)
            else:
                entry.desired.clear()  # rendered from the set resolved before
            entry.resolved = (key, resolution)
        return entry.resolved[1]

    def desired(self, pool: Mapping[str, Any], ctx: RenderContext, spec: InferencePoolSpec,
                ordinals: Mapping[Role, Ordinals]) -> Desired:
        """`render.desired.desired(ctx, spec, ordinals)`, for `spec` as `validated(pool)` returned it."""
        entry = self._specs.get(_pid(pool))
        if entry is None or entry.resolved is None or entry.resolved[1].spec is not spec:
            # not a spec `validated` returned: nothing kept applies
            self.counts.desired_misses += 1
            return desired(ctx, spec, ordinals)
        key = (ctx, tuple(sorted(ordinals.items())))
        made = entry.desired.get(key)
        if made is None:
            self.counts.desired_misses += 1
            made = desired(ctx, spec, ordinals)
            if len(entry.desired) >= DESIRED_KEPT:
                entry.desired.pop(next(iter(entry.desired)))
            entry.desired[key] = made
        else:
            self.counts.desired_hits += 1
        return made

    def previous(self, pool: Mapping[str, Any]) -> InferencePoolStatus:
        """The pool's status parsed (`status.parse_status`). Its wire form is not kept: it is needed only when the
        new status differs from it as a model, and then a write follows anyway (and it was a third of the memory
        kept per pool)."""
        pid = _pid(pool)
        raw = pool.get("status")
        kept = self._statuses.get(pid)
        if kept is not None and kept.raw == raw:
            self.counts.status_hits += 1
            return kept.parsed
        self.counts.status_misses += 1
        kept = _Status(raw=json_copy(raw), parsed=status_writes.parse_status(raw))
        self._statuses[pid] = kept
        return kept.parsed

    def _spec_entry(self, pool: Mapping[str, Any]) -> _Spec:
        pid = _pid(pool)
        generation = pool["metadata"].get("generation")
        raw = pool.get("spec")
        entry = self._specs.get(pid)
        if entry is not None and entry.generation == generation and entry.raw == raw:
            self.counts.spec_hits += 1
            return entry
        self.counts.spec_misses += 1
        spec, problems = checks.validate_pool(pool)
        entry = _Spec(generation=generation, raw=json_copy(raw), spec=spec, problems=tuple(problems))
        self._specs[pid] = entry
        return entry


def _pid(pool: Mapping[str, Any]) -> PoolId:
    meta = pool["metadata"]
    return meta.get("namespace", ""), meta.get("name", ""), str(meta.get("uid", ""))
