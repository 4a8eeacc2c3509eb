"""The operator process's long-lived parts, created once and shared by the handlers through kopf's memo."""

from __future__ import annotations

import asyncio
import dataclasses

from pdfleet.operator.cache import Cache, PoolKey
from pdfleet.operator.controller import Controller
from pdfleet.operator.kube.client import KubeClient
from pdfleet.operator.workqueue import WorkQueue


@dataclasses.dataclass(frozen=True)
class Options:
    namespaces: tuple[str, ...] = ()  # empty: all namespaces
    kubeconfig: str | None = None
    workers: int = 4
    resync_period: float = 300.0
    metrics_port: int = 9090
    health_port: int = 8080
    bind_address: str = "0.0.0.0"


@dataclasses.dataclass
class OperatorState:
    options: Options
    cache: Cache = dataclasses.field(default_factory=Cache)
    queue: WorkQueue[PoolKey] = dataclasses.field(default_factory=WorkQueue)
    client: KubeClient | None = None
    controller: Controller | None = None
    tasks: list[asyncio.Task[None]] = dataclasses.field(default_factory=list)
    ready: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
