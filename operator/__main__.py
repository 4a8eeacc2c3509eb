"""`pdfleet-operator`: runs the operator (kopf, standalone) with its metrics and health endpoints."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from typing import Any

import kopf
from aiohttp import web
from prometheus_client import start_http_server

from pdfleet.operator import (
    handlers,  # noqa: F401  (registers the kopf handlers)
    metrics,
)
from pdfleet.operator.runtime_state import OperatorState, Options


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
    p.add_argument("--runtime-image", help="image of the init container that brings pdfleet's runtime into "
                   "engine pods (default: the runtime image of this operator's version)")
    p.add_argument("--log-format", choices=["text", "json"], default="text")
    p.add_argument("--log-level", choices=["debug", "info", "warning", "error"], default="info")
    return p.parse_args(argv)


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


async def serve_health(state: OperatorState) -> web.AppRunner:
    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def readyz(_: web.Request) -> web.Response:
        # Ready once the first listing of pools has arrived and workers run.
        ok = state.ready.is_set() and state.controller is not None
        return web.Response(text="ok" if ok else "not ready", status=200 if ok else 503)

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, state.options.bind_address, state.options.health_port).start()
    return runner


async def run(options: Options) -> None:
    state = OperatorState(options=options)
    if options.metrics_port:
        start_http_server(options.metrics_port, addr=options.bind_address, registry=metrics.REGISTRY)
    runner = await serve_health(state) if options.health_port else None
    # The cache fills as soon as the watch lists pools; an empty cluster lists none, so readiness also
    # follows the first resync-free moment after startup.
    try:
        await kopf.operator(
            standalone=True,
            clusterwide=not options.namespaces,
            namespaces=list(options.namespaces),
            memo=kopf.Memo(state=state),
        )
    finally:
        if runner:
            await runner.cleanup()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    configure_logging(args.log_format, args.log_level)
    options = Options(
        namespaces=tuple(args.namespace), kubeconfig=args.kubeconfig, workers=args.workers,
        resync_period=args.resync_period, metrics_port=args.metrics_port, health_port=args.health_port,
        bind_address=args.bind_address, runtime_image=args.runtime_image,
    )
    try:
        asyncio.run(run(options))
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
