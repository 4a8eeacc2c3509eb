"""`pdfleet-operator`: runs the operator (kopf, standalone) with its metrics and health endpoints."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import secrets
import signal
import socket
import sys
from pathlib import Path
from typing import Any

import kopf
from aiohttp import web
from prometheus_client import start_http_server

from pdfleet.operator import (
    handlers,  # noqa: F401  (registers the kopf handlers)
    kopf_support,
    metrics,
)
from pdfleet.operator.api import pool_policy
from pdfleet.operator.api.pool_policy import PoolPolicy
from pdfleet.operator.api.scalars import parse_duration
from pdfleet.operator.kube.kube_client import KubeClient, load_configuration
from pdfleet.operator.leader.decision import Timings
from pdfleet.operator.leader.elector import LeaderElector
from pdfleet.operator.leader.lease import LeaseStore
from pdfleet.operator.render.context import (
    DEFAULT_OPERATOR_LABELS,
    DEFAULT_OPERATOR_NAMESPACE,
    DEFAULT_RUNTIME_IMAGE,
    Settings,
)
from pdfleet.operator.runtime_state import LeaderElection, OperatorState, Options

log = logging.getLogger("pdfleet.operator")

SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
# Exit status after losing the Lease: the Deployment restarts the process, which then stands by.
EXIT_LOST_LEASE = 3


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S%z"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key in ("pool", "namespace", "reason"):
            if hasattr(record, key):
                out[key] = getattr(record, key)
        if record.exc_info:
            out["error"] = self.formatException(record.exc_info)
        return json.dumps(out)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="pdfleet-operator", description=__doc__)
    scope = p.add_mutually_exclusive_group()
    scope.add_argument("--all-namespaces", "-A", action="store_true", help="watch every namespace (default)")
    scope.add_argument("--namespace", "-n", action="append", default=[], help="watch this namespace (repeatable)")
    p.add_argument("--kubeconfig", help="kubeconfig to use outside a cluster (default: in-cluster, then KUBECONFIG)")
    p.add_argument("--workers", type=int, default=4, help="pools reconciled concurrently")
    p.add_argument("--resync-period", type=float, default=300.0, help="seconds between level-based resyncs")
    p.add_argument("--metrics-port", type=int, default=9090, help="Prometheus /metrics port (0 disables)")
    p.add_argument("--health-port", type=int, default=8080, help="/healthz and /readyz port (0 disables)")
    p.add_argument("--bind-address", default="0.0.0.0", help="address the metrics and health servers bind")
    p.add_argument("--watch-deadline", type=_seconds, default=120.0, metavar="DURATION",
                   help="how long kopf may watch fewer kinds than the operator handles (the API's discovery said "
                   "they are not served: a restarting apiserver, a missing CRD) before /healthz fails, so that "
                   "kubelet restarts the operator (default: 2m; /readyz fails at once)")
    p.add_argument("--runtime-image", help="image of the init container that brings pdfleet's runtime into "
                   "engine pods, e.g. REPO:TAG or REPO@sha256:... (the chart passes its runtime.image; default: "
                   f"{DEFAULT_RUNTIME_IMAGE})")
    net = p.add_argument_group("network policies", "each pool's NetworkPolicies (docs/security.md)")
    net.add_argument("--network-policies", choices=["true", "false"], default="true",
                     help="render NetworkPolicies for pools that do not say (spec.networkPolicy.enabled); "
                     "default: true")
    net.add_argument("--operator-namespace", help="the namespace of the operator's pods, which the policies let "
                     f"reach engines and routers (default: the pod's own, else {DEFAULT_OPERATOR_NAMESPACE})")
    net.add_argument("--operator-labels", type=_labels, default=DEFAULT_OPERATOR_LABELS, metavar="K=V,...",
                     help="labels of the operator's pods, for the same (default: "
                     f"{','.join(f'{k}={v}' for k, v in DEFAULT_OPERATOR_LABELS)})")
    policy = p.add_argument_group(
        "pool policy", "what a pool may ask for that reaches past its namespace (docs/security.md); each flag is "
        "repeatable, and '*' allows anything. A pool asking for more is not accepted (ForbiddenByPolicy)")
    policy.add_argument("--allow-host-path-prefix", action="append", default=[], metavar="PATH",
                        help="a host folder model.source.hostPath may name, itself or below (default: none)")
    policy.add_argument("--allow-priority-class", action="append", default=[], metavar="NAME",
                        help="a PriorityClass engine and router pods may use (default: none)")
    policy.add_argument("--allow-toleration-key", action="append", default=[], metavar="KEY",
                        help="a taint key pods may tolerate besides the GPU taint (default: none)")
    policy.add_argument("--allow-image-prefix", action="append", metavar="PREFIX",
                        help="images pools may run: a prefix ending in '/' (a registry or project), or one "
                        "repository with any tag or digest (default: '*', any image)")
    policy.add_argument("--require-non-root-engines", action="store_true",
                        help="refuse pools whose engines would run as their image's user (root for SGLang's): "
                        "spec.engine.runAsUser must name another")
    p.add_argument("--log-format", choices=["text", "json"], default="text")
    p.add_argument("--log-level", choices=["debug", "info", "warning", "error"], default="info")
    le = p.add_argument_group("leader election", "several replicas, one of which leads (a coordination.k8s.io "
                              "Lease); the others serve health and metrics and write nothing")
    le.add_argument("--leader-elect", action="store_true", help="elect a leader before reconciling anything")
    le.add_argument("--leader-elect-lease-duration", type=_seconds, default=15.0, metavar="DURATION",
                    help="how long a standby waits after the leader's last renewal before taking over "
                    "(default: 15s)")
    le.add_argument("--leader-elect-renew-deadline", type=_seconds, default=10.0, metavar="DURATION",
                    help="how long the leader keeps trying to renew before it exits (default: 10s)")
    le.add_argument("--leader-elect-retry-period", type=_seconds, default=2.0, metavar="DURATION",
                    help="time between attempts to acquire or renew (default: 2s)")
    le.add_argument("--leader-elect-namespace", help="namespace of the Lease (default: the namespace the pod "
                    "runs in; required outside a pod)")
    le.add_argument("--leader-elect-id", default="pdfleet-operator", help="name of the Lease (default: "
                    "pdfleet-operator)")
    args = p.parse_args(argv)
    if args.leader_elect:
        if not args.leader_elect_namespace:
            args.leader_elect_namespace = _pod_namespace()
            if not args.leader_elect_namespace:
                p.error("--leader-elect needs --leader-elect-namespace outside a pod")
        try:
            _timings(args).validate()
        except ValueError as e:
            p.error(f"--leader-elect: {e}")
    for flag, values in (("--allow-host-path-prefix", args.allow_host_path_prefix),
                         ("--allow-image-prefix", args.allow_image_prefix or [])):
        for value in values:
            if problem := pool_policy.prefix_problem(flag, value):
                p.error(problem)
    return args


def _policy(args: argparse.Namespace) -> PoolPolicy:
    return PoolPolicy(host_path_prefixes=tuple(args.allow_host_path_prefix),
                      priority_classes=tuple(args.allow_priority_class),
                      toleration_keys=tuple(args.allow_toleration_key),
                      image_prefixes=tuple(args.allow_image_prefix) if args.allow_image_prefix else (pool_policy.ANY,),
                      require_non_root_engines=args.require_non_root_engines)


def _labels(text: str) -> tuple[tuple[str, str], ...]:
    """k=v,k=v: the labels that select the operator's pods."""
    pairs = [item.partition("=") for item in text.split(",") if item.strip()]
    if not pairs or any(not k.strip() or not eq or not v.strip() for k, eq, v in pairs):
        raise argparse.ArgumentTypeError(f"expected k=v[,k=v...], got {text!r}")
    return tuple(sorted((k.strip(), v.strip()) for k, _, v in pairs))


def _seconds(text: str) -> float:
    """A duration flag: 15s, 500ms or 1m (as controller-runtime spells them), or plain seconds."""
    try:
        return float(text)
    except ValueError:
        pass
    if text.endswith("ms") and text[:-2].isdigit():
        return int(text[:-2]) / 1000
    try:
        return parse_duration(text).total_seconds()
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _timings(args: argparse.Namespace) -> Timings:
    return Timings(lease_duration=args.leader_elect_lease_duration, renew_deadline=args.leader_elect_renew_deadline,
                   retry_period=args.leader_elect_retry_period)


def _pod_namespace() -> str | None:
    try:
        return SERVICE_ACCOUNT_NAMESPACE.read_text().strip() or None
    except OSError:
        return None


def _render_settings(args: argparse.Namespace) -> Settings:
    return Settings(runtime_image=args.runtime_image or DEFAULT_RUNTIME_IMAGE,
                    network_policies=args.network_policies == "true",
                    operator_namespace=args.operator_namespace or _pod_namespace() or DEFAULT_OPERATOR_NAMESPACE,
                    operator_labels=args.operator_labels, policy=_policy(args))


def _identity() -> str:
    """The pod's name (the chart passes POD_NAME) or the host name, plus a random suffix: a restarted process
    is a new candidate, never mistaken for the leader it replaced."""
    base = os.environ.get("POD_NAME") or os.environ.get("HOSTNAME") or socket.gethostname()
    return f"{base}_{secrets.token_hex(4)}"


def configure_logging(fmt: str, level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else
                         logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.getLogger("kopf").setLevel(max(logging.INFO, root.level))
    # kopf reports every handled watch event at INFO; the operator's own logs say what changed.
    logging.getLogger("kopf.objects").setLevel(max(logging.WARNING, root.level))
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)


async def serve_health(state: OperatorState, elector: LeaderElector | None) -> web.AppRunner:
    def standby() -> bool:
        return elector is not None and not elector.is_leader

    async def healthz(_: web.Request) -> web.Response:
        if standby():
            return web.Response(text="ok: standby")
        why = state.watch.dead() if state.watch is not None else None
        return web.Response(text=f"not alive: {why}" if why else "ok", status=503 if why else 200)

    async def readyz(_: web.Request) -> web.Response:
        # A standby is ready: it does what it should (nothing), and rollouts and `helm --wait` need it Ready.
        if elector is not None and standby():
            return web.Response(text=f"ok: standby, the leader is {elector.holder or 'not known yet'}")
        # The leader (or the only replica) is ready once kopf's startup handler has built the controller and started
        # the workers, and kopf watches every kind the operator handles (kopf_watch.py).
        if not state.ready.is_set() or state.controller is None:
            return web.Response(text="not ready: starting", status=503)
        why = state.watch.missing() if state.watch is not None else None
        return web.Response(text=f"not ready: {why}" if why else "ok", status=503 if why else 200)

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, state.options.bind_address, state.options.health_port).start()
    return runner


async def run_kopf(state: OperatorState) -> None:
    # The modules that import kopf's private ones (the fence, .importlinter's kopf-fence), imported only once main()
    # has checked the installed kopf is one they were written for (kopf_support.py): another may not have them.
    from pdfleet.operator import kopf_fixes, kopf_watch

    options = state.options
    kopf_fixes.install()
    state.watch = kopf_watch.coverage(kopf.get_default_registry(), deadline=options.watch_deadline)
    await kopf.operator(
        standalone=True,
        clusterwide=not options.namespaces,
        namespaces=list(options.namespaces),
        memo=kopf.Memo(state=state),
        insights=state.watch.insights,
    )


async def lead(state: OperatorState, elector: LeaderElector) -> None:
    """Stands by until elected, then runs kopf while renewing the Lease. Losing the Lease ends the process at
    once: kopf's writes must stop before the next leader's begin, and a clean shutdown could take longer than
    the margin between the renew deadline and the lease duration."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):  # kopf installs its own once it runs
        loop.add_signal_handler(sig, stop.set)
    if not await elector.acquire(stop):
        return
    # Both created before kopf starts, so that kopf's shutdown does not wait for them as for its own.
    holding = asyncio.create_task(elector.hold())
    stopping = asyncio.create_task(stop.wait())  # a signal before kopf has installed its own handlers
    operating = asyncio.create_task(run_kopf(state))
    try:
        await asyncio.wait({holding, stopping, operating}, return_when=asyncio.FIRST_COMPLETED)
        if holding.done():
            error = holding.exception()
            reason = holding.result() if error is None else f"the renewal loop failed: {error!r}"
            log.critical("lost leadership of the Lease %s (%s): exiting so that no write of this replica can "
                         "race the next leader's", elector.lease, reason)
            logging.shutdown()
            os._exit(EXIT_LOST_LEASE)
        operating.cancel()  # a no-op once kopf has stopped by itself (on its own signal handling)
        holding.cancel()
        # Release only once kopf and the renewals have stopped: no write of ours can follow the release.
        await asyncio.gather(holding, operating, return_exceptions=True)
        await elector.release()
        if not operating.cancelled():
            operating.result()  # kopf's own error, if it failed
    finally:
        for task in (holding, stopping, operating):
            task.cancel()


async def run(options: Options) -> None:
    state = OperatorState(options=options)
    election = options.leader_election
    client = KubeClient(await load_configuration(options.kubeconfig)) if election else None
    elector = LeaderElector(LeaseStore(client, election.namespace, election.name), election.identity,
                            election.timings) if client and election else None
    if options.metrics_port:
        start_http_server(options.metrics_port, addr=options.bind_address, registry=metrics.REGISTRY)
    runner = await serve_health(state, elector) if options.health_port else None
    try:
        if elector:
            await lead(state, elector)
        else:
            await run_kopf(state)
    finally:
        if runner:
            await runner.cleanup()
        if client:
            await client.close()


# Exit status when the installed kopf is not one the operator's fixes to it were written for.
EXIT_UNSUPPORTED_KOPF = 2


def main(argv: list[str] | None = None) -> int:
    # Before anything else (arguments included): a kopf the fixes were not written for is refused with one message.
    why = kopf_support.problem()
    if why is not None:
        print(f"pdfleet-operator: refusing to start: {why}", file=sys.stderr)
        return EXIT_UNSUPPORTED_KOPF
    args = parse_args(argv)
    configure_logging(args.log_format, args.log_level)
    options = Options(
        namespaces=tuple(args.namespace), kubeconfig=args.kubeconfig, workers=args.workers,
        resync_period=args.resync_period, metrics_port=args.metrics_port, health_port=args.health_port,
        bind_address=args.bind_address, watch_deadline=args.watch_deadline, render=_render_settings(args),
        leader_election=LeaderElection(namespace=args.leader_elect_namespace, name=args.leader_elect_id,
                                       identity=_identity(), timings=_timings(args)) if args.leader_elect else None,
    )
    try:
        asyncio.run(run(options))
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
