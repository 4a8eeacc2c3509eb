"""What the desync fixes cost per loop iteration, on the reproduction harness with nothing diverging.

`python -m tests.repro.overhead --world N --iterations I --rounds R --workdir DIR --patches ID... [--role R]`
forks N ranks on a real gloo group (as `decode_loop` does). Each rank installs the patches once with pdfleet's
patch framework, keeping SGLang's original functions as well, and then switches its SGLang classes between the
two in place. With `--role decode` it runs the decode loop of `decode_loop.run_loop` (SGLang's own intake,
`process_decode_queue`, prealloc handshake and transfer polls) and the decode step of `retraction.run_loop`
(SGLang's `update_running_batch` on a running batch); with `--role prefill` the prefill loop of
`prefill.run_loop` (intake, bootstrap, waiting-queue and chunk polls, inflight poll) and SGLang's prefill
admission (`admitting.run_loop`). No forward pause. Each workload runs in blocks of `sc.iterations`
iterations: one warm-up block of each variant, then `ROUNDS` times unpatched, patched, patched, unpatched (so a
drift of the machine's load weighs on both). Every block starts from fresh SGLang objects and sees the same
arrivals.

Each rank writes `overhead-rank{N}.json` in `sc.workdir`: per workload and variant, every iteration's wall
time in ns, the collective calls per iteration, the block outcomes (which must not differ between variants:
nothing diverges), and which SGLang functions ran patched in each variant (read back from SGLang).
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from tests.repro import admission, admitting, decode_loop, prefill, retraction
from tests.repro import scenario as scenario_mod

UNPATCHED, PATCHED = "unpatched", "patched"
# No divergence anywhere. `idle`: no request at all, so unpatched SGLang enters only the request broadcast
# (its poll guards skip the rest) while the patched loop still exchanges every iteration: the worst ratio.
# `busy`: one request arrives in the transfer (prefill: bootstrap) queue and one in the prealloc (prefill:
# bootstrap, three polls) queue every iteration, so both loops poll a few requests in flight every iteration.
# `decoding` (decode role): a running batch of 4 requests through SGLang's `update_running_batch` every
# iteration, the step retraction-consensus agrees (nothing is ever retracted: every rank has room).
# `resuming` (decode role): SGLang's `resume_retracted_reqs` over three retracted requests that all fit, the call
# admission-consensus agrees (measured alone: the call is short, so its ratio is an upper bound).
# `admitting` (prefill role): SGLang's `get_new_batch_prefill` with its real PrefillAdder over real pools, three
# waiting requests that fit, the call admission-consensus agrees every prefill iteration (measured alone, likewise;
# the prefill loops above admit with a fixed stand-in, so their figures leave this agreement out).
BUSY_SPAN = 10_000  # more iterations than any block runs: arrivals never stop within a block
NEVER = 1 << 30  # no rank's pool ever fills
# What a block's result says besides what became of its requests.
_BOOKKEEPING = frozenset({"rank", "iterations", "iteration_ns"})

Loop = Callable[[scenario_mod.Scenario, int, Any, Any], dict[str, Any]]


def _decoding(sc: scenario_mod.Scenario, rank: int, group: Any, rank_writer: Any) -> dict[str, Any]:
    return retraction.run_loop(sc, rank, group, rank_writer, offload=False, tight_from=NEVER)


def workloads(role: str) -> dict[str, tuple[Loop, dict[str, Any]]]:
    """name -> (the loop, the scenario fields it runs with), for a harness run of `role`."""
    busy = {"arrivals": {i: [(f"t{i}", 6)] for i in range(BUSY_SPAN)},
            "handshakes": {i: [(f"h{i}", 3)] for i in range(BUSY_SPAN)}}
    idle: dict[str, Any] = {"arrivals": {}, "handshakes": {}}
    if role == "prefill":
        return {"idle": (prefill.run_loop, idle), "busy": (prefill.run_loop, busy),
                "admitting": (admitting.run_loop, idle)}
    return {"idle": (decode_loop.run_loop, idle), "busy": (decode_loop.run_loop, busy), "decoding": (_decoding, idle),
            "resuming": (admission.run_loop, idle)}


def result_path(sc: scenario_mod.Scenario, rank: int) -> Path:
    return Path(sc.workdir) / f"overhead-rank{rank}.json"


class Switch:
    """SGLang's target functions of a patch set, both as shipped and as patched, installable in turn."""

    def __init__(self, patch_ids: tuple[str, ...]) -> None:
        from pdfleet.runtime.patches import catalogue, targets

        dotted = [t for entry in catalogue.CATALOGUE if entry.id in patch_ids for t in entry.targets]
        self._targets = {name: targets.resolve(name) for name in dotted}
        # The attribute as stored (a property stays a property), read before and after the install.
        self._variants: dict[str, dict[str, Any]] = {UNPATCHED: self._stored()}
        self.applied = decode_loop._apply_patches(patch_ids)
        self._variants[PATCHED] = self._stored()

    def _stored(self) -> dict[str, Any]:
        return {name: inspect.getattr_static(t.owner, t.attr) for name, t in self._targets.items()}

    def install(self, variant: str) -> dict[str, str]:
        """Puts `variant`'s functions in place; returns which functions now run patched (read from SGLang): the
        harness's usual list and every target of the patch set (`_get_new_batch_prefill_raw` is not on the list)."""
        for name, stored in self._variants[variant].items():
            target = self._targets[name]
            setattr(target.owner, target.attr, stored)
        found = decode_loop._patched_targets()
        for target in self._targets.values():
            stored = inspect.getattr_static(target.owner, target.attr)
            function = getattr(stored, "fget", None) or getattr(stored, "__func__", None) or stored
            patch_id = getattr(function, "__pdfleet_patch__", None)
            if patch_id:
                found[f"{target.owner.__name__}.{target.attr}"] = patch_id
        return found


class CollectiveCount:
    """Counts the collective calls this process makes (broadcast, all-reduce, all-gather), wherever SGLang
    or a patch calls them from: both look `torch.distributed`'s functions up at call time."""

    def __init__(self) -> None:
        import torch.distributed as dist

        self.calls = 0
        for name in ("broadcast", "all_reduce", "all_gather"):
            setattr(dist, name, self._counted(getattr(dist, name)))

    def _counted(self, function: Callable[..., Any]) -> Callable[..., Any]:
        def collective(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            return function(*args, **kwargs)

        return collective


def _block(sc: scenario_mod.Scenario, rank: int, group: Any, rank_writer: Any, loop: Loop,
           story: Mapping[str, Any], count: CollectiveCount) -> tuple[list[int], dict[str, Any], int]:
    """One block from fresh SGLang objects: each iteration's time, what became of each request, and how
    many collective calls the block made."""
    before = count.calls
    result = loop(dataclasses.replace(sc, **story), rank, group, rank_writer)
    outcome = {key: value for key, value in result.items() if key not in _BOOKKEEPING}
    return result["iteration_ns"], outcome, count.calls - before


def bench_rank(sc: scenario_mod.Scenario, rank: int, rounds: int) -> None:
    import torch.distributed as dist

    rank_writer = decode_loop.join(sc, rank)
    switch = Switch(sc.patches)
    log = decode_loop.instrument(rank_writer)
    count = CollectiveCount()
    group = dist.group.WORLD
    report: dict[str, Any] = {"rank": rank, "applied": switch.applied, "patched_targets": {},
                              "workloads": {}}
    order = [UNPATCHED, PATCHED] + [v for _ in range(rounds) for v in (UNPATCHED, PATCHED, PATCHED, UNPATCHED)]
    for name, (loop, story) in workloads(sc.role).items():
        times: dict[str, list[int]] = {UNPATCHED: [], PATCHED: []}
        outcomes: dict[str, list[dict[str, Any]]] = {UNPATCHED: [], PATCHED: []}
        calls = {UNPATCHED: 0, PATCHED: 0}
        for index, variant in enumerate(order):
            report["patched_targets"][variant] = switch.install(variant)
            iteration_ns, outcome, block_calls = _block(sc, rank, group, log, loop, story, count)
            outcomes[variant].append(outcome)
            calls[variant] += block_calls
            if index >= 2:  # the first block of each variant warms caches and gloo's buffers
                times[variant].extend(iteration_ns)
        per_iteration = {v: calls[v] / (order.count(v) * sc.iterations) for v in calls}
        report["workloads"][name] = {"iteration_ns": times, "outcomes": outcomes, "collectives": per_iteration}
    switch.install(UNPATCHED)
    result_path(sc, rank).write_text(json.dumps(report))
    log.close()


def main(argv: list[str]) -> int:
    import argparse

    from tests.support import ports

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", type=int, required=True)
    parser.add_argument("--iterations", type=int, required=True, help="iterations per block")
    parser.add_argument("--rounds", type=int, required=True, help="unpatched, patched, patched, unpatched rounds")
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--patches", nargs="+", required=True)
    parser.add_argument("--role", choices=("decode", "prefill"), default="decode", help="the loops to run")
    args = parser.parse_args(argv)
    sc = scenario_mod.Scenario(
        port=ports.free_port(), ledger=str(Path(args.workdir) / "ledger"), workdir=args.workdir,
        patches=tuple(args.patches), world=args.world, iterations=args.iterations, local_aborts={},
        forward_s=0.0, idle_s=0.0, role=args.role,
    )
    return decode_loop.launch(sc, rank_fn=lambda s, rank: bench_rank(s, rank, args.rounds))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
