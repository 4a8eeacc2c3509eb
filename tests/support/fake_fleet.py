"""A running pool without a cluster: the in-memory apiserver, fake agents and a fake router on loopback, and the
operator's own parts wired as `handlers.startup` wires them (monitor -> reconcile pokes, monitor -> routers'
membership, membership -> events through the executor). For tests of the operator's I/O layer."""

from __future__ import annotations

import base64
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

from pdfleet.operator.cache import PoolKey
from pdfleet.operator.controller import Controller
from pdfleet.operator.engines.bake_probes import BakeProber
from pdfleet.operator.engines.engine_client import EngineClient, pod_address
from pdfleet.operator.engines.membership import RouterMembership
from pdfleet.operator.engines.monitor import HealthMonitor
from pdfleet.operator.render.engine_group import AGENT_PORT
from pdfleet.operator.render.router_objects import METRICS_PORT
from pdfleet.runtime.health import phases
from tests.support import server_args
from tests.support.fake_engines import FakeAgent, FakeEngine, FakeRouter, healthy, rank
from tests.support.fake_kube import FakeKube
from tests.support.pools import pool_body

KEY: PoolKey = ("ns", "tiny")
PREFILL, DECODE = "tiny-prefill-0", "tiny-decode-0"  # the groups
PODS = {PREFILL: "tiny-prefill-0-0", DECODE: "tiny-decode-0-0"}
# Outside the local cluster's pod and node ranges (127.1.x.0/24, 127.254.0.0/16), whose processes may run meanwhile.
IPS = {PREFILL: "127.77.0.2", DECODE: "127.77.0.3"}
ROUTER_IP = "127.77.2.1"
ENGINE_PORT = 30000  # the engines' default port: only the router is told of it, nothing connects to it
URLS = {group: f"http://{ip}:{ENGINE_PORT}" for group, ip in IPS.items()}
LOOPS = {PREFILL: phases.LoopName.EVENT_LOOP_OVERLAP_DISAGG_PREFILL,
         DECODE: phases.LoopName.EVENT_LOOP_OVERLAP_DISAGG_DECODE}
E = TypeVar("E", bound=FakeEngine)


@dataclasses.dataclass
class Fleet:
    kube: FakeKube
    controller: Controller
    monitor: HealthMonitor
    membership: RouterMembership
    agents: dict[str, FakeAgent]  # by group
    router: FakeRouter
    pokes: list[PoolKey]
    clock: list[float]  # the membership's clock: [seconds]

    def ready(self, group: str, ready: bool = True) -> None:
        """Kubelet says the group's pod is (not) Ready."""
        self.kube.run_pod(KEY[0], PODS[group], ip=IPS[group], ready=ready)

    def events(self, reason: str) -> list[dict[str, Any]]:
        return [e for e in self.kube.of_kind("Event", KEY[0]) if e["reason"] == reason]


@contextlib.asynccontextmanager
async def fake_fleet(*, prober: BakeProber | None = None, **spec: Any) -> AsyncIterator[Fleet]:
    """One prefill engine (tp 1) and one decode engine (tp 2), both Ready and healthy, a router pod that has
    registered both (as its discovery would), and a settled pool. `spec`: `pool_body`'s spec updates."""
    router = FakeRouter(ROUTER_IP)
    fakes = {PREFILL: FakeAgent(IPS[PREFILL], healthy(1)), DECODE: FakeAgent(IPS[DECODE], healthy(2))}
    monitor: HealthMonitor | None = None
    engines: EngineClient | None = None
    try:
        router_port = await router.start()
        ports = {agent.host: await agent.start() for agent in fakes.values()}

        def address(pod: dict[str, Any], port: int) -> tuple[str, int] | None:
            found = pod_address(pod, port)  # the pod's own IP, as the operator's default addressing
            if found is not None and port == METRICS_PORT and found[0] == ROUTER_IP:
                return ROUTER_IP, router_port  # the fake router serves its metrics on its one port
            if found is None or port != AGENT_PORT:
                return found
            return found[0], ports[found[0]]  # its fake agent's free port

        engines = EngineClient(addressing=address, timeout=1.0)
        kube = FakeKube()
        kube.seed(pool_body(decode__tp=2, decode__gpusPerNode=2, router__port=router_port, **spec))
        pokes: list[PoolKey] = []
        clock = [0.0]
        monitor = HealthMonitor(cache=kube.cache(), engines=engines,
                                poke=pokes.append, prober=prober)
        controller = Controller(client=kube, cache=kube.cache(), health=monitor.health)
        membership = RouterMembership(routers=engines, key=controller.router_keys.for_pod,
                                      post_event=controller.post_event,
                                      clock=lambda: clock[0])
        monitor.after_poll = membership.sync
        await controller.reconcile(KEY)
        fleet = Fleet(kube, controller, monitor, membership, fakes, router, pokes, clock)
        for group in PODS:
            fleet.ready(group)
        _start_router(kube, router.host)
        router.key = _router_key(kube)
        await controller.reconcile(KEY)
        kube.take_writes()
        router.register(URLS[PREFILL], "prefill", bootstrap_port=8998)
        router.register(URLS[DECODE], "decode")
        yield fleet
    finally:
        if monitor is not None:
            await monitor.close()  # its polling tasks
        if engines is not None:
            await engines.close()
        for server in (router, *fakes.values()):
            await server.close()


def _start_router(kube: FakeKube, ip: str) -> None:
    """What the Deployment and ReplicaSet controllers and kubelet would do: one router pod, Running at `ip`."""
    deployment = kube.get("Deployment", KEY[0], "tiny-router")
    assert deployment is not None
    kube.update("Deployment", KEY[0], "tiny-router", lambda d: d.update(
        status={"replicas": 1, "availableReplicas": 1}))
    kube.seed({"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": "tiny-router-6f9c-x2x4z", "namespace": KEY[0],
                            "labels": deployment["spec"]["template"]["metadata"]["labels"],
                            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                                                 "name": "tiny-router-6f9c", "uid": "uid-rs", "controller": True}]},
               "spec": deployment["spec"]["template"]["spec"],
               "status": {"phase": "Running", "podIP": ip, "conditions": [{"type": "Ready", "status": "True"}]}})


def _router_key(kube: FakeKube) -> str:
    """The key the router pod started with, from the Secret the operator made (as kubelet would read it)."""
    secret = kube.get("Secret", KEY[0], "tiny-router-key")
    assert secret is not None, "the operator made no router-key Secret"
    return base64.b64decode(secret["data"]["key-1"]).decode()


@contextlib.asynccontextmanager
async def engine_servers(make: Callable[[str], E]) -> AsyncIterator[dict[str, E]]:
    """One engine server per group (`make(ip)`) at its pod's IP, on one port for both roles, as a pool with a
    router has it: pass `prefill__port` and `decode__port` of the first to `fake_fleet`."""
    servers = {group: make(ip) for group, ip in IPS.items()}
    try:
        port = await servers[PREFILL].start()
        servers[DECODE].port = port
        await servers[DECODE].start()
        yield servers
    finally:
        for server in servers.values():
            await server.close()


@contextlib.asynccontextmanager
async def rendered_fleet(engines: dict[str, E], *, prober: BakeProber | None = None,
                         **spec: Any) -> AsyncIterator[Fleet]:
    """`fake_fleet` with `engines` (from `engine_servers`) as its engines, a 20 s heartbeat, every rank on the loop
    the spec implies and every engine's /server_info showing what its pod was rendered with: the gates pass unless
    a test changes something. `spec`: more of `pool_body`'s spec updates."""
    async with fake_fleet(health={"heartbeatPeriod": "20s"}, prefill__port=engines[PREFILL].port,
                          decode__port=engines[DECODE].port, prober=prober, **spec) as fleet:
        for group, agent in fleet.agents.items():
            agent.ranks = [rank(n, loop=LOOPS[group]) for n in range(len(agent.ranks))]
        for group, engine in engines.items():
            pod = fleet.kube.get("Pod", KEY[0], PODS[group])
            assert pod is not None
            engine.args = server_args.shown_by(pod)
        yield fleet
