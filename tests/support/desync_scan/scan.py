"""Every collective a PD scheduler rank can reach from its event loop, with the calls and conditions in front.

The roots are the four PD event loops; the request handlers are reached through the Scheduler's
`TypeBasedDispatcher`, which graph.py resolves to every handler in its table. Each reached call of a primitive
(primitives.py) is a `Collective`, keyed `site:primitive` (the function that makes the call, and what it
calls), with the entries it is reached from: the calls the loops make directly and the dispatched handlers.
tests/unit/test_desync_scan.py holds the result against docs/desync-audit.md.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from tests.support.desync_scan import doors, holders
from tests.support.desync_scan.graph import Graph, Node, Primitive, Site
from tests.support.desync_scan.index import Class, Function, Index

SCHEDULER = "sglang.srt.managers.scheduler.Scheduler"
ROOTS = (
    "sglang.srt.disaggregation.prefill.SchedulerDisaggregationPrefillMixin.event_loop_normal_disagg_prefill",
    "sglang.srt.disaggregation.prefill.SchedulerDisaggregationPrefillMixin.event_loop_overlap_disagg_prefill",
    "sglang.srt.disaggregation.decode.SchedulerDisaggregationDecodeMixin.event_loop_normal_disagg_decode",
    "sglang.srt.disaggregation.decode.SchedulerDisaggregationDecodeMixin.event_loop_overlap_disagg_decode",
)

# Functions the scan does not enter, each with why; docs/desync-audit.md names them under the scan's limits.
BOUNDARIES: dict[str, str] = {
    "sglang.srt.model_executor.model_runner.ModelRunner.forward":
        "the model forward (graph replay, attention back-ends, the model's layers): entered iff a batch runs, its "
        "collectives fixed by the batch; out of the audit's scope. The sampler, `ModelRunner.sample`, is entered",
}


@dataclass(frozen=True)
class Step:
    function: str
    line: int
    call: str
    conditions: tuple[str, ...]


@dataclass
class Collective:
    site: str  # the function whose body calls the primitive
    primitive: str
    entries: set[str] = field(default_factory=set)
    chain: tuple[Step, ...] = ()  # a shortest chain of calls from a loop to the primitive call

    @property
    def key(self) -> str:
        return f"{self.site}:{self.primitive}"


@dataclass
class Scan:
    collectives: dict[str, Collective]
    functions: int  # functions reached
    unresolved: Counter[str]  # call text -> count, over the reached functions' calls the scan could not follow
    files: set[Path]
    reached: frozenset[str] = frozenset()  # qualified names of the functions reached
    doors: dict[str, set[str]] = field(default_factory=dict)  # HTTP route / gRPC method -> handlers (doors.py)
    boundary: frozenset[str] = frozenset()  # model methods met and not entered (holders.MODEL_BOUNDARY)


def _scheduler_node(index: Index, dotted: str) -> Node:
    function = index.resolve(dotted)
    scheduler = index.resolve(SCHEDULER)
    assert isinstance(function, Function) and isinstance(scheduler, Class), dotted
    return Node(function, scheduler)


def _callees(graph: Graph, node: Node) -> list[tuple[Site, Node]]:
    if node.name in BOUNDARIES:
        return []
    return [(site, t) for site in graph.sites(node) for t in site.targets if isinstance(t, Node)]


def scan(package_root: Path, kinds: frozenset[str] = holders.KINDS) -> Scan:
    index = Index(package_root)
    graph = Graph(index, kinds)
    roots = [_scheduler_node(index, r) for r in ROOTS]

    parent: dict[Node, tuple[Node, Site] | None] = {r: None for r in roots}
    queue = deque(roots)
    while queue:
        node = queue.popleft()
        for site, callee in _callees(graph, node):
            if callee not in parent:
                parent[callee] = (node, site)
                queue.append(callee)

    entries: set[Node] = {t for r in roots for _, t in _callees(graph, r)}
    for node in parent:
        for site in graph.sites(node) if node.name not in BOUNDARIES else []:
            if site.dispatch:
                entries.update(t for t in site.targets if isinstance(t, Node))

    collectives: dict[str, Collective] = {}

    def record(node: Node, entry: str) -> None:
        for site in graph.sites(node) if node.name not in BOUNDARIES else []:
            for target in site.targets:
                if isinstance(target, Primitive):
                    found = collectives.setdefault(f"{node.name}:{target.name}", Collective(node.name, target.name))
                    found.entries.add(entry)
                    if not found.chain:
                        found.chain = _chain(parent, node, site)

    for root in roots:
        record(root, root.name)
    stops = set(roots) | entries
    for entry in entries:
        seen = {entry}
        queue = deque([entry])
        while queue:
            node = queue.popleft()
            record(node, entry.name)
            for _, callee in _callees(graph, node):
                if callee not in seen and callee not in stops:
                    seen.add(callee)
                    queue.append(callee)

    unresolved: Counter[str] = Counter()
    for node in parent:
        for site in graph.sites(node) if node.name not in BOUNDARIES else []:
            if site.unresolved:
                unresolved[site.text] += 1
    reached = frozenset(n.name for n in parent)
    scheduler = index.resolve(SCHEDULER)
    assert isinstance(scheduler, Class)
    found_doors = doors.doors(graph, scheduler)
    return Scan(collectives, len(reached), unresolved, {m.path for m in index.modules}, reached, found_doors,
                frozenset(graph.boundary))


def collectives_from(graph: Graph, start: Node) -> set[str]:
    """The `site:primitive` keys reachable from one function: a scan of a single entry, for tests of the graph."""
    keys: set[str] = set()
    seen = {start}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for site in graph.sites(node) if node.name not in BOUNDARIES else []:
            for target in site.targets:
                if isinstance(target, Primitive):
                    keys.add(f"{node.name}:{target.name}")
                elif target not in seen:
                    seen.add(target)
                    queue.append(target)
    return keys


def _chain(parent: dict[Node, tuple[Node, Site] | None], node: Node, last: Site) -> tuple[Step, ...]:
    steps = [Step(node.name, last.line, last.text, last.conditions)]
    link = parent.get(node)
    while link is not None:
        caller, site = link
        steps.append(Step(caller.name, site.line, site.text, site.conditions))
        link = parent.get(caller)
    return tuple(reversed(steps))


@cache
def installed() -> Scan:
    """The scan of the installed SGLang, once per process."""
    import sglang

    return scan(Path(sglang.__file__).parent)


def short(dotted: str) -> str:
    """`sglang.srt.managers.scheduler.Scheduler.flush_cache` -> `Scheduler.flush_cache` (class-qualified
    where a class is named, else module.function): the form rows of the audit page use."""
    parts = dotted.split(".")
    for index, part in enumerate(parts):
        if part[:1].isupper():
            return ".".join(parts[index:])
    return ".".join(parts[-2:])


def report(found: Scan) -> str:
    """Each collective with its entries and a chain from a loop, each call with the conditions in front."""
    lines = []
    for key in sorted(found.collectives):
        collective = found.collectives[key]
        lines.append(f"{key}\n  entries: {', '.join(sorted(short(e) for e in collective.entries))}")
        for step in collective.chain:
            lines.append(f"    {short(step.function)}:{step.line} -> {step.call}")
            lines.extend(f"        | {condition}" for condition in step.conditions)
    return "\n".join(lines)


if __name__ == "__main__":
    print(report(installed()))
