"""The operator process's long-lived parts, created once and shared by the handlers through kopf's memo."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import TYPE_CHECKING

from pdfleet.operator.autoscaler import Autoscaler
from pdfleet.operator.cache import Cache, PoolKey
from pdfleet.operator.controller import Controller
from pdfleet.operator.engines.engine_client import EngineClient
from pdfleet.operator.engines.membership import RouterMembership
from pdfleet.operator.engines.monitor import HealthMonitor
from pdfleet.operator.kube.kube_client import KubeClient
from pdfleet.operator.leader.decision import Timings
from pdfleet.operator.render.context import Settings
from pdfleet.operator.role_scaler import RoleScaler
from pdfleet.operator.workqueue import WorkQueue

if TYPE_CHECKING:  # kopf_watch imports kopf's private modules: only after kopf_support accepted kopf (__main__.py)
    from pdfleet.operator.kopf_watch import WatchCoverage


@dataclasses.dataclass(frozen=True)
class LeaderElection:
    namespace: str  # of the Lease
    name: str  # of the Lease
    identity: str  # this process, as the Lease's holderIdentity
    timings: Timings


@dataclasses.dataclass(frozen=True)
class Options:
    namespaces: tuple[str, ...] = ()  # empty: all namespaces
    kubeconfig: str | None = None
    workers: int = 4
    resync_period: float = 300.0
    metrics_port: int = 9090
    health_port: int = 8080
    bind_address: str = "0.0.0.0"
    watch_deadline: float = 120.0  # seconds kopf may watch fewer kinds than the operator handles (kopf_watch.py)
    # What shapes rendered objects: the runtime image, NetworkPolicies.
    render: Settings = dataclasses.field(default_factory=Settings)
    owned_event_delay: float = 0.2  # seconds owned-object events wait to coalesce
    leader_election: LeaderElection | None = None  # None: this process is the only operator


@dataclasses.dataclass
class OperatorState:
    options: Options
    cache: Cache | None = None  # set at startup, from kopf's indices
    queue: WorkQueue[PoolKey] = dataclasses.field(default_factory=WorkQueue)
    seen: set[PoolKey] = dataclasses.field(default_factory=set)  # pools whose event handler has run
    client: KubeClient | None = None
    controller: Controller | None = None
    health: HealthMonitor | None = None  # polls the engines' rank agents; set at startup
    membership: RouterMembership | None = None  # keeps the routers' workers to what the operator judged
    engines: EngineClient | None = None  # the one client to engines and routers, shared by all of the above
    role_scaler: RoleScaler | None = None  # mirrors InferencePoolRoles' scale and the pools' replicas
    autoscaler: Autoscaler | None = None  # spec.autoscaling, after each health poll
    tasks: list[asyncio.Task[None]] = dataclasses.field(default_factory=list)
    ready: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    watch: WatchCoverage | None = None  # what kopf watches against what the handlers need; set when kopf starts

    def poke(self, key: PoolKey, *, urgent: bool = False) -> None:
        """A change to the pool itself: reconcile now; `urgent` (a spec not handled yet) before other work."""
        self.seen.add(key)
        self.queue.add(key, urgent=urgent)
        if self.health:
            self.health.watch(key)

    def poke_soon(self, key: PoolKey, *, health: bool = True, stranded: bool = False) -> None:
        """A change to something the pool owns: reconcile shortly, so that the burst of pod events a new
        group causes (scheduled, IP assigned, Ready) is handled by one reconcile and one status write. `health`:
        the change may change a verdict too (a pod with an address, or going): poll the pool's agents now.
        `stranded`: the object is a deleted pod that holds nothing and that Kueue's finalizer keeps Terminating
        (planning/scale/gang_wait.stranded); its pool's reconcile releases it even when the pool is deleted and no
        longer reconciled (a deleted pool's waiting pods, a namespace deleted with its pools), so it is queued then
        too."""
        if key in self.seen:
            self.queue.add_after(key, self.options.owned_event_delay)
            if self.health and health:
                self.health.nudge(key)
        elif stranded:
            self.queue.add_after(key, self.options.owned_event_delay)

    def echo(self, key: PoolKey) -> None:
        """The pool changed by the operator's own write (its status, an annotation): reconcile it shortly, like an
        owned object's event, so that the echo and the events of the objects the same reconcile wrote are handled
        by one reconcile instead of one each. Nothing for the health monitor: no pod changed."""
        if key in self.seen:
            self.queue.add_after(key, self.options.owned_event_delay)
        else:
            self.poke(key)

    def unchanged_but_for_autoscaling(self, key: PoolKey, resource_version: str | None) -> bool:
        """Whether the pool at `resource_version` is the echo of the autoscaler's own status.autoscaling write and
        nothing else: no reconcile is owed for it (`Autoscaler.wrote`)."""
        return self.autoscaler is not None and self.autoscaler.wrote(key, resource_version)

    def forget(self, key: PoolKey) -> None:
        self.seen.discard(key)
        self.queue.forget(key)
        if self.health:
            self.health.forget(key)
        if self.controller:
            self.controller.forget(key)
        if self.membership:
            self.membership.forget(key)
        if self.role_scaler:
            self.role_scaler.forget(key)
        if self.autoscaler:
            self.autoscaler.forget(key)
