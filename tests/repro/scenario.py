"""One reproduction run, as plain data that crosses into the rank processes as JSON."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

SGLANG_VERSION = "0.5.23"
METADATA_SLOTS = 64  # free metadata buffers of a prefill rank unless a scenario says otherwise
KV_FREE = 2000  # free KV tokens of a prefill rank with SGLang's own admission unless a scenario says otherwise

# The default story. Two transfers arrive at iteration 0: `req-y` completes after 2 polls and is decoded;
# `req-x` stays in flight. One rank's own clock (rank 2, or the last rank of a smaller group) says `req-x`
# timed out at iteration 3, rank 0's at iteration 5 (per-rank clocks, as in upstream #27221); the other ranks
# never see a local signal.
ARRIVALS: dict[int, list[tuple[str, int]]] = {0: [("req-x", 10_000), ("req-y", 2)]}


def early_rank(world: int) -> int:
    """The rank whose clock fires first in the default story."""
    if world < 2:
        raise ValueError(f"a desync needs at least 2 ranks, not {world}")
    return min(2, world - 1)


def local_aborts_for(world: int) -> dict[int, dict[int, str]]:
    return {early_rank(world): {3: "req-x"}, 0: {5: "req-x"}}


LOCAL_ABORTS: dict[int, dict[int, str]] = local_aborts_for(4)


@dataclasses.dataclass(frozen=True)
class Scenario:
    """`arrivals`: iteration -> [(rid, polls until its KV lands)], broadcast by rank 0. `local_aborts`: rank ->
    {iteration: rid}, an abort signal seen by that rank only. `patches`: catalogue ids applied in every rank.
    `straggle`: rank -> {iteration: seconds} that rank spends in local work before that iteration's intake (a
    slow rank). `kill_at`: rank -> the iteration at whose start that rank SIGKILLs itself (tests/repro/rank_hooks.py).
    `handshakes`: iteration -> [(rid, polls until its handshake completes)], broadcast by rank 0 into the
    prealloc queue (then preallocated and transferred in one poll). `retracted`: rank -> [first, stop), the
    iterations in which that rank alone holds a retracted request (its own memory decided so). With
    `role="prefill"`, `arrivals` bootstrap in one poll and their KV lands `polls` polls after their prefill, and
    `handshakes` take `polls` polls to bootstrap. `health_checks`: iteration -> rids of `/health_generate`
    requests rank 0 broadcasts (tests/repro/health_check.py). `metadata_slots`: rank -> the free metadata
    buffers of that rank's prefill bootstrap queue (`METADATA_SLOTS` for any other rank). `kv_free`: rank -> the
    free KV tokens of that rank's prefill pool; when set, prefill admission is SGLang's own
    (tests/repro/prefill_admission.py, `KV_FREE` for any other rank) instead of the fixed stand-in.
    `held_releases`: rank -> the iteration from which that rank alone holds an entry in its decode transfer
    queue's `_deferred_releases` that never becomes ready (a divergence injected at `all_reduce_flags`)."""

    port: int
    ledger: str
    workdir: str
    patches: tuple[str, ...] = ()
    world: int = 4
    iterations: int = 40
    arrivals: dict[int, list[tuple[str, int]]] = dataclasses.field(default_factory=lambda: dict(ARRIVALS))
    local_aborts: dict[int, dict[int, str]] = dataclasses.field(default_factory=lambda: dict(LOCAL_ABORTS))
    decode_steps: int = 4  # forwards until a decoding request finishes
    forward_s: float = 0.05  # how long one simulated forward takes
    idle_s: float = 0.05  # the idle pause of a rank without a batch
    gloo_timeout_s: float = 120.0  # long enough never to fire while a hang is being detected
    straggle: dict[int, dict[int, float]] = dataclasses.field(default_factory=dict)
    kill_at: dict[int, int] = dataclasses.field(default_factory=dict)
    handshakes: dict[int, list[tuple[str, int]]] = dataclasses.field(default_factory=dict)
    retracted: dict[int, list[int]] = dataclasses.field(default_factory=dict)
    role: str = "decode"  # or "prefill": the loop the ranks run (tests/repro/prefill.py)
    health_checks: dict[int, list[str]] = dataclasses.field(default_factory=dict)
    metadata_slots: dict[int, int] = dataclasses.field(default_factory=dict)
    kv_free: dict[int, int] = dataclasses.field(default_factory=dict)
    held_releases: dict[int, int] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        ranked = {*self.local_aborts, *self.retracted, *self.metadata_slots, *self.kv_free, *self.held_releases}
        outside = sorted(rank for rank in ranked if not 0 <= rank < self.world)
        if outside:  # e.g. the 4-rank default story in a smaller group: it would silently never desync
            raise ValueError(f"local events for ranks {outside} outside a group of {self.world}; "
                             f"use local_aborts_for({self.world})")
        hooked = sorted(rank for rank in {*self.straggle, *self.kill_at} if not 0 <= rank < self.world)
        if hooked:  # a fault for a rank that does not exist would never fire, and the run would pass untested
            raise ValueError(f"straggle or kill_at for ranks {hooked} outside a group of {self.world}")

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Scenario:
        raw: dict[str, Any] = json.loads(text)
        raw["patches"] = tuple(raw["patches"])
        for field in ("arrivals", "handshakes"):
            raw[field] = {int(i): [(rid, int(n)) for rid, n in reqs] for i, reqs in raw[field].items()}
        raw["retracted"] = {int(r): [int(i) for i in window] for r, window in raw["retracted"].items()}
        raw["health_checks"] = {int(i): list(rids) for i, rids in raw["health_checks"].items()}
        raw["metadata_slots"] = {int(r): int(n) for r, n in raw["metadata_slots"].items()}
        raw["kv_free"] = {int(r): int(n) for r, n in raw["kv_free"].items()}
        raw["held_releases"] = {int(r): int(i) for r, i in raw["held_releases"].items()}
        raw["straggle"] = {int(r): {int(i): float(s) for i, s in late.items()} for r, late in raw["straggle"].items()}
        raw["kill_at"] = {int(r): int(i) for r, i in raw["kill_at"].items()}
        signals = raw["local_aborts"].items()
        raw["local_aborts"] = {int(r): {int(i): rid for i, rid in sig.items()} for r, sig in signals}
        return cls(**raw)

    def holds_retracted(self, rank: int, iteration: int) -> bool:
        first, stop = self.retracted.get(rank, (0, 0))
        return first <= iteration < stop

    def result_path(self, rank: int) -> Path:
        return Path(self.workdir) / f"rank{rank}.json"
