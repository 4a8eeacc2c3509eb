"""A pool on the local fleet, as the end-to-end tests drive it: pods played by `pdfleet-sim`, engines served by
the engine simulator, faults injected by pod annotation (docs/local-fleet.md)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import http.server
import json
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from pdfleet.podrunner import loadgen
from tests.support.cluster import Cluster, wait_for
from tests.support.pools import example

FAULT = "sim.pdfleet.dev/fault"
FAULT_RANK = "sim.pdfleet.dev/fault-rank"


# What apply_pool() merges into the example's rollout unless a test says otherwise: the tests of a rollout's
# mechanics (gates, rollback, pause, replacements under load) run without a bake or a watch, replace groups in
# place (the default) and hold on a failed gate; test_bake_e2e.py rolls out with the example's.
MECHANICS = {"autoRollback": False, "verification": {"bake": "0s"}, "postRolloutWatch": "0s",
             "maxSurge": {"prefill": 0, "decode": 0}}


def apply_pool(cluster: Cluster, namespace: str, name: str, *, base: str = "local-fleet", baked: bool = False,
               **spec: dict[str, Any]) -> dict[str, Any]:
    """Applies the example `base` as pool `name`, each keyword merged into the spec section it names (a rollout's
    `verification` merged one level deeper). `baked`: the example's rollout as it is, else MECHANICS first."""
    body = pool_manifest(namespace, name, base=base, baked=baked, **spec)
    cluster.kubectl("apply", "-f", "-", input=json.dumps(body))
    return body


def pool_manifest(namespace: str, name: str, *, base: str = "local-fleet", baked: bool = False,
                  **spec: dict[str, Any]) -> dict[str, Any]:
    """The body `apply_pool` applies."""
    body = example(base)
    body["metadata"] = {"name": name, "namespace": namespace}
    if not baked:
        rollout = body["spec"].setdefault("rollout", {})
        rollout.update({k: v for k, v in MECHANICS.items() if k != "verification"})
        rollout.setdefault("verification", {}).update(MECHANICS["verification"])
    for section, values in spec.items():
        if section == "rollout" and isinstance(values, dict):
            rollout = body["spec"].setdefault("rollout", {})
            rollout.update({k: v for k, v in values.items() if k != "verification"})
            rollout.setdefault("verification", {}).update(values.get("verification") or {})
        elif isinstance(values, dict):
            body["spec"].setdefault(section, {}).update(values)
        else:
            body["spec"][section] = values
    return body


def pool(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    return cluster.get("pdpool", name, "-n", namespace)


def phase(cluster: Cluster, namespace: str, name: str) -> str | None:
    return (pool(cluster, namespace, name).get("status") or {}).get("phase")


def engine_pods(cluster: Cluster, namespace: str, name: str, **labels: str) -> list[dict[str, Any]]:
    selector = ",".join([f"pdfleet.dev/pool={name}", "app.kubernetes.io/component!=router",
                         *(f"pdfleet.dev/{k}={v}" for k, v in labels.items())])
    return cluster.get("pods", "-n", namespace, "-l", selector)["items"]


def router_pods(cluster: Cluster, namespace: str, name: str) -> list[dict[str, Any]]:
    return cluster.get("pods", "-n", namespace, "-l",
                       f"pdfleet.dev/pool={name},app.kubernetes.io/component=router")["items"]


def is_ready(pod: dict[str, Any]) -> bool:
    status = pod.get("status") or {}
    ready = any(c["type"] == "Ready" and c["status"] == "True" for c in status.get("conditions") or [])
    return ready and bool(status.get("podIP")) and not pod["metadata"].get("deletionTimestamp")


def group_status(cluster: Cluster, namespace: str, name: str, group: str) -> dict[str, Any]:
    status = pool(cluster, namespace, name).get("status") or {}
    return next((g for g in status.get("groups", []) if g["name"] == group), {})


def conditions(cluster: Cluster, namespace: str, name: str) -> dict[str, dict[str, Any]]:
    return conditions_of(pool(cluster, namespace, name).get("status") or {})


def conditions_of(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The conditions of a status already read: a check that also reads the groups or revisions must take them
    from the same read, or a newer condition could vouch for older groups."""
    return {c["type"]: c for c in status.get("conditions", [])}


def events(cluster: Cluster, namespace: str, name: str, reason: str) -> list[dict[str, Any]]:
    return cluster.get("events", "-n", namespace, "--field-selector",
                       f"involvedObject.name={name},reason={reason}")["items"]


def event_lines(cluster: Cluster, namespace: str) -> list[str]:
    """Every Event of the namespace as one line, oldest first: what a failed assertion shows of the story."""
    items = cluster.get("events", "-n", namespace)["items"]
    items.sort(key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")
    return [f"{e.get('lastTimestamp') or e.get('eventTime')} {e['involvedObject'].get('name')} {e['type']} "
            f"{e['reason']}: {e.get('message', '')}" for e in items]


def wait_ready(cluster: Cluster, namespace: str, name: str, timeout: float = 180) -> None:
    def ready() -> bool:
        return phase(cluster, namespace, name) == "Ready"
    wait_for(f"pool {name} Ready", ready, timeout=timeout, interval=0.5)


def http_get(url: str, timeout: float = 3, headers: dict[str, str] | None = None) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")
    except OSError:
        return 0, ""


def router_key(cluster: Cluster, namespace: str, name: str, pod: dict[str, Any] | None = None) -> str:
    """The control-plane key a router pod started with (by default the current one), read from the pool's
    Secret as an admin who may read Secrets would."""
    secret = cluster.get("secret", f"{name}-router-key", "-n", namespace)
    key = secret["metadata"]["annotations"]["pdfleet.dev/current-key"]
    if pod is not None:
        env = pod["spec"]["containers"][0].get("env") or []
        key = next(v["valueFrom"]["secretKeyRef"]["key"] for v in env if v["name"] == "PDFLEET_ROUTER_ADMIN_KEY")
    return base64.b64decode(secret["data"][key]).decode()


def admin(key: str) -> dict[str, str]:
    """The headers of a call to the router's control plane."""
    return {"Authorization": f"Bearer {key}"}


def workers(url: str, key: str) -> list[dict[str, Any]] | None:
    """The router's registered workers, asked with `key`; None when it does not list them."""
    code, body = http_get(f"{url}/workers", headers=admin(key))
    return json.loads(body)["workers"] if code == 200 else None


def router_url(cluster: Cluster, namespace: str, name: str, *, workers: int) -> str:
    """The router's URL (its pod IP, a loopback address) once it has `workers` workers registered."""
    port = pool(cluster, namespace, name)["spec"]["router"]["port"]

    def found() -> str | None:
        pods = [p for p in router_pods(cluster, namespace, name) if is_ready(p)]
        if not pods:
            return None
        url = f"http://{pods[0]['status']['podIP']}:{port}"
        code, body = http_get(f"{url}/workers", headers=admin(router_key(cluster, namespace, name, pods[0])))
        if code != 200:
            return None
        listed = json.loads(body)
        count = len(listed.get("workers", listed if isinstance(listed, list) else []))
        return url if count >= workers else None
    return wait_for(f"the router of {name} with {workers} workers", found, timeout=180, interval=0.5)


def inject(cluster: Cluster, namespace: str, pod: str, fault: str, **params: str) -> None:
    extra = [f"sim.pdfleet.dev/{k.replace('_', '-')}={v}" for k, v in params.items()]
    cluster.kubectl("annotate", "pod", pod, "-n", namespace, "--overwrite", f"{FAULT}={fault}", *extra)


@contextlib.contextmanager
def steady_load(url: str, *, model: str, concurrency: int = 4, timeout_s: float = 10,
                endpoints: Callable[[], Sequence[str]] | None = None,
                rate: float | None = None) -> Iterator[loadgen.Load]:
    """A client load from a thread of its own, stopped (and its requests finished) on exit: `concurrency`
    clients in a closed loop, or with `rate`, that many requests a second however long the answers take."""
    load = loadgen.Load(url, model=model, concurrency=concurrency, timeout_s=timeout_s, endpoints=endpoints)
    loop = asyncio.new_event_loop()
    run = load.run() if rate is None else load.run_steps([loadgen.Step(rate, float("inf"))])
    thread = threading.Thread(target=lambda: loop.run_until_complete(run), daemon=True)
    thread.start()
    try:
        yield load
    finally:
        loop.call_soon_threadsafe(load.stop)
        thread.join(timeout=30)


@contextlib.contextmanager
def every(interval_s: float, step: Callable[[], None]) -> Iterator[None]:
    """Runs `step` every `interval_s` from a thread of its own until the block ends."""
    stop = threading.Event()

    def run() -> None:
        while not stop.wait(interval_s):
            step()
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


@contextlib.contextmanager
def ready_routers(cluster: Cluster, namespace: str, name: str, *, every_s: float = 0.2) -> Iterator[list[str]]:
    """The URLs of the pool's Ready, not terminating router pods, kept current from a thread: the endpoints a
    Service would send new connections to (the local control plane runs no EndpointSlice controller, and tests
    never go through a Service IP)."""
    current: list[str] = []

    def follow() -> None:
        current[:] = loadgen.ready_urls(router_pods(cluster, namespace, name))
    with every(every_s, follow):
        yield current


@contextlib.contextmanager
def foreign_engine(ip: str, port: int, seen: list[str] | None = None) -> Iterator[str]:
    """A server that is no engine of the pool, answering what sglang-router asks before it adds a worker (the
    registration surface of an SGLang engine); every request it gets is appended to `seen`, if given."""
    answers = {"/health": {}, "/health_generate": {}, "/v1/models": {"object": "list", "data": []},
               "/server_info": {"model_path": "foreign", "disaggregation_mode": "decode"},
               "/model_info": {"model_path": "foreign", "is_generation": True}}

    class Handler(http.server.BaseHTTPRequestHandler):
        def _answer(self) -> None:
            if seen is not None:
                seen.append(f"{self.command} {self.path}")
            path = self.path.split("?")[0]
            body = json.dumps(answers.get(path, {})).encode()
            self.send_response(200 if path in answers else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = _answer

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer((ip, port), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://{ip}:{port}"
    finally:
        server.shutdown()
        server.server_close()
