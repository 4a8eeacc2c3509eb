"""Whether kopf watches every kind the operator handles: part of the operator's readiness and liveness.

kopf learns which kinds the API serves from its discovery, once when it starts and again only when a CRD changes.
An apiserver that is restarting while the operator starts can answer that none of the operator's kinds is served
(kopf logs "Unresolved resources cannot be served"): kopf then watches none of them, for good, and the operator
reconciles nothing while its process runs and its probes said ok. Now the operator is not ready while a kind it
handles is not watched, and not alive once that has lasted `deadline` seconds, so that kubelet restarts it and
kopf asks again. A CRD missing from the cluster (the chart installed without its CRDs) reads the same: the log and
the probes name it. kopf scans the CRD's group again when the CRD is created or changes, but that scan can come
before the API serves the new kind (measured here: the CRD's last event, then 'not served', then nothing more),
and the restart heals that too.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Iterable

from kopf._cogs.structs import references
from kopf._core.intents import registries

log = logging.getLogger(__name__)


def watched_selectors(registry: registries.OperatorRegistry) -> frozenset[references.Selector]:
    """What the operator's handlers select and kopf must watch: the union kopf itself watches for
    (kopf._core.reactor.observation.revise_resources)."""
    return frozenset(registry._indexing.get_all_selectors() | registry._watching.get_all_selectors() |
                     registry._spawning.get_all_selectors() | registry._changing.get_all_selectors())


def coverage(registry: registries.OperatorRegistry, deadline: float) -> WatchCoverage:
    """A coverage of what `registry`'s handlers select, over new insights for kopf.operator(insights=...) to fill."""
    return WatchCoverage(references.Insights(), watched_selectors(registry), deadline=deadline)


def kind_name(selector: references.Selector) -> str:
    """A selector as `kubectl api-resources` names a kind: plural.group (the plural alone in the core group)."""
    name = selector.plural or selector.kind or selector.any_name or "?"
    return f"{name}.{selector.group}" if selector.group else str(name)


def unwatched(selectors: Iterable[references.Selector], watched: Iterable[references.Resource]) -> list[str]:
    """The kinds that some selector names and no watched resource matches, sorted by name."""
    resources = list(watched)
    return sorted({kind_name(s) for s in selectors if not any(s.check(r) for r in resources)})


@dataclasses.dataclass
class WatchCoverage:
    """kopf's insights (what it discovered and watches) against what the operator's handlers need."""

    insights: references.Insights
    selectors: frozenset[references.Selector]
    deadline: float  # seconds a kind may stay unwatched before the operator is not alive
    _since: float | None = dataclasses.field(default_factory=time.monotonic)  # unwatched since; None: all watched
    _reported: bool = False

    def missing(self, now: float | None = None) -> str | None:
        """Why the operator is not ready (None: kopf watches every kind the operator handles)."""
        now = time.monotonic() if now is None else now
        if not self.insights.ready_resources.is_set():
            why = "kopf has not finished its first discovery of the API's resources"
        else:
            kinds = unwatched(self.selectors, self.insights.watched_resources)
            why = f"kopf does not watch {', '.join(kinds)} (the API's discovery said they are not served)" \
                if kinds else None
        if why is None:
            self._since, self._reported = None, False
        elif self._since is None:
            self._since = now
        return why

    def dead(self, now: float | None = None) -> str | None:
        """Why the operator should be restarted (None: it should not): a kind unwatched for `deadline` seconds."""
        now = time.monotonic() if now is None else now
        why = self.missing(now)
        if why is None or self._since is None or now - self._since < self.deadline:
            return None
        why = f"{why} for {now - self._since:.0f} s; kopf discovers again only when a CRD changes, so a restart does"
        if not self._reported:
            self._reported = True
            log.error("not alive: %s", why)
        return why
