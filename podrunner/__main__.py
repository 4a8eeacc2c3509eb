"""`pdfleet-sim`: the local cluster's pod runner (docs/local-fleet.md). Started by `hack/localcluster.py up`.

    python -m pdfleet.podrunner [--cluster-dir DIR] [--port N]
    pdfleet-sim load --url http://<router pod IP>:<port> ...     a client load through a pool's router
    pdfleet-sim load --url ... --ramp 5:60:5 --ramp-seconds 180   ... on a schedule of rates, reported per phase
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
from pathlib import Path

import aiohttp

from pdfleet.podrunner import logs
from pdfleet.podrunner.events import Recorder
from pdfleet.podrunner.kube import Client, Kubeconfig
from pdfleet.podrunner.node import Node
from pdfleet.podrunner.processes import Zygote
from pdfleet.podrunner.runner import Runner

log = logging.getLogger("pdfleet.podrunner")
DEFAULT_PORT = 20248


def default_cluster_dir() -> Path:
    # As hack/localcluster.py computes it.
    if os.environ.get("PDFLEET_CLUSTER_DIR"):
        return Path(os.environ["PDFLEET_CLUSTER_DIR"])
    cache = Path(os.environ.get("PDFLEET_CACHE") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
                 / "pdfleet")
    return cache / "cluster"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="pdfleet-sim", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cluster-dir", type=Path, default=default_cluster_dir(),
                   help="the local cluster's directory (pods' state goes under pods/)")
    p.add_argument("--kubeconfig", type=Path, help="admin kubeconfig (default: <cluster dir>/kubeconfig)")
    p.add_argument("--host", default="127.0.0.1", help="address of /healthz")
    p.add_argument("--port", type=int, default=int(os.environ.get("PDFLEET_SIM_PORT") or DEFAULT_PORT),
                   help="port of /healthz (env PDFLEET_SIM_PORT)")
    p.add_argument("--shutdown-grace", type=float, default=10.0,
                   help="seconds a pod gets to stop when the runner itself stops")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    return p.parse_args(argv)


async def run(args: argparse.Namespace) -> int:
    cluster_dir = args.cluster_dir.resolve()
    (cluster_dir / "pods").mkdir(parents=True, exist_ok=True)
    (cluster_dir / "logs").mkdir(parents=True, exist_ok=True)
    client = Client(Kubeconfig(args.kubeconfig or cluster_dir / "kubeconfig"))
    zygote = Zygote(sys.executable, cluster_dir / "logs" / "pdfleet-sim-zygote.log")
    probe_session = aiohttp.ClientSession()
    node = Node(client=client, zygote=zygote, events=Recorder(client), probe_session=probe_session,
                python=sys.executable, cluster_dir=cluster_dir, shutdown_grace_s=args.shutdown_grace)
    runner = Runner(node)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    health = await runner.serve_health(args.host, args.port)
    log.info("pdfleet-sim starting", extra={"fields": {"cluster_dir": str(cluster_dir), "port": args.port,
                                                       "python": sys.executable}})
    await zygote.start()
    main = asyncio.create_task(runner.run())
    died = asyncio.create_task(zygote.died.wait())
    stopping = asyncio.create_task(stop.wait())
    done, _ = await asyncio.wait({main, died, stopping}, return_when=asyncio.FIRST_COMPLETED)
    code = 0
    if main in done and main.exception():
        log.error("runner failed", exc_info=main.exception())
        code = 1
    if died in done and not stop.is_set():
        log.error("the zygote died; stopping")
        code = 1
    main.cancel()
    await runner.stop_all()
    for task in (main, died, stopping):
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
    await zygote.stop()
    await health.cleanup()
    await probe_session.close()
    await client.close()
    log.info("pdfleet-sim stopped", extra={"fields": {"code": code}})
    return code


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["load"]:
        from pdfleet.podrunner import loadgen

        return loadgen.main(argv[1:])
    args = parse_args(argv)
    logs.configure(args.log_level)
    try:
        return asyncio.run(run(args))
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
