"""The `pdfleet` command's wiring without a cluster: following a pool's watch to an exit code, printing on a
terminal or not, one-line errors for a missing kubeconfig, an unreachable apiserver and bad usage, and the reads
and the watch against a fake apiserver on 127.0.0.1."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from kubernetes_asyncio import client as k8s

from pdfleet.operator.cli import __main__ as cli
from pdfleet.operator.cli.kube import CliError, PoolReader
from pdfleet.operator.cli.report import Exit
from pdfleet.operator.kube.kube_client import KubeClient
from tests.unit.test_cli_report import failed_cluster, ready_cluster, recorded, verifying_cluster

Body = dict[str, Any]


class FakeReader:
    """Serves `pools` in turn: the first to `pool()`, the rest as watch events, one watch per list in `watches`."""

    def __init__(self, first: Body, watches: list[list[tuple[str, Body]]], reread: Body | None = None) -> None:
        self.namespace, self.name = "ns", "tiny"
        self.first, self.watches, self.reread = first, watches, reread
        self.reads = 0
        self.watched_from: list[str] = []

    async def pool(self) -> Body:
        self.reads += 1
        return self.first if self.reads == 1 or self.reread is None else self.reread

    async def watch(self, resource_version: str) -> AsyncIterator[Body]:
        self.watched_from.append(resource_version)
        for kind, body in self.watches.pop(0) if self.watches else []:
            yield {"type": kind, "object": body}


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def with_version(pool: Body, version: str) -> Body:
    pool["metadata"]["resourceVersion"] = version
    return pool


def follow(reader: FakeReader, out: io.StringIO, *, watch: bool = True) -> int:
    printer = cli.Printer(out, tty=out.isatty())
    return asyncio.run(cli.follow(reader, printer, watch=watch))  # type: ignore[arg-type]


def test_watch_follows_the_pool_until_the_rollout_completes_verified() -> None:
    verifying = with_version(recorded(verifying_cluster()), "10")
    done = verifying_cluster()
    done.engines = True
    done.converge(limit=30)
    reader = FakeReader(verifying, [[("MODIFIED", verifying), ("MODIFIED", with_version(recorded(done), "12"))]])
    out = io.StringIO()
    assert follow(reader, out) == Exit.COMPLETE
    lines = out.getvalue().splitlines()
    assert len(lines) == 2, "a line per change, none for an unchanged state"
    assert " in progress: 0/3 groups verified; waiting for gate eventLoop of decode group tiny-decode-0" in lines[0]
    assert " complete: 3/3 groups verified" in lines[1]
    assert reader.watched_from == ["10"]


def test_watch_exits_1_when_a_gate_fails() -> None:
    reader = FakeReader(recorded(verifying_cluster()), [[("MODIFIED", recorded(failed_cluster()))]])
    out = io.StringIO()
    assert follow(reader, out) == Exit.FAILED
    assert "FAILED: 0/3 groups verified; GateFailed: gate eventLoop failed for decode group tiny-decode-0" in \
        out.getvalue().splitlines()[-1]


def test_a_watch_the_apiserver_ends_is_started_again_from_a_fresh_read() -> None:
    verifying = with_version(recorded(verifying_cluster()), "10")
    reader = FakeReader(verifying, [[]], reread=with_version(recorded(ready_cluster()), "20"))
    assert follow(reader, io.StringIO()) == Exit.COMPLETE
    assert reader.reads == 2 and reader.watched_from == ["10"]


def test_a_pool_deleted_while_watched_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    verifying = recorded(verifying_cluster())
    assert follow(FakeReader(verifying, [[("DELETED", verifying)]]), io.StringIO()) == Exit.FAILED
    assert capsys.readouterr().err == "error: InferencePool ns/tiny was deleted\n"


def test_without_watch_a_rollout_in_progress_exits_3_after_one_line() -> None:
    out = io.StringIO()
    reader = FakeReader(recorded(verifying_cluster()), [])
    assert follow(reader, out, watch=False) == Exit.IN_PROGRESS
    assert len(out.getvalue().splitlines()) == 1 and reader.watched_from == []


def test_on_a_terminal_the_line_is_rewritten_in_place_with_a_progress_bar(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "100")
    verifying = recorded(verifying_cluster())
    out = Terminal()
    assert follow(FakeReader(verifying, [[("MODIFIED", recorded(ready_cluster()))]]), out) == Exit.COMPLETE
    text = out.getvalue()
    assert text.startswith("\r\033[K") and text.endswith("\n") and text.count("\n") == 1
    first, last = text.split("\r\033[K")[1:]
    assert first.startswith("[------------------------] pool ns/tiny: rollout of revision ")
    assert len(first) == 99 and first.endswith("…"), "cut to the terminal's width while in progress"
    assert last.startswith("[########################] pool ns/tiny: rollout of revision ")
    assert last.endswith("complete: 3/3 groups verified; every group of revision "
                         f"{recorded(ready_cluster())['status']['updateRevision']} passed verification\n")
    plain = io.StringIO()
    follow(FakeReader(verifying, [[("MODIFIED", recorded(ready_cluster()))]]), plain)
    assert "\r" not in plain.getvalue() and "[" not in plain.getvalue()


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = cli.main(list(argv), out=io.StringIO())
    err = capsys.readouterr().err
    return code, err


def test_a_missing_kubeconfig_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    missing = tmp_path / "nothing-here"
    code, err = run_cli(capsys, "status", "tiny", "--kubeconfig", str(missing))
    assert code == 2
    assert err == f"error: no kubeconfig: {missing} does not exist (set KUBECONFIG or pass --kubeconfig)\n"


def test_an_unreachable_apiserver_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with socket.socket() as s:  # a port nothing listens on: bound, never listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(f"""apiVersion: v1
kind: Config
clusters: [{{name: c, cluster: {{server: "https://127.0.0.1:{port}", insecure-skip-tls-verify: true}}}}]
users: [{{name: u, user: {{token: t}}}}]
contexts: [{{name: x, context: {{cluster: c, user: u, namespace: team-a}}}}]
current-context: x
""")
        for argv in (["status", "tiny"], ["rollout", "status", "tiny", "--watch"]):
            code, err = run_cli(capsys, *argv, "--kubeconfig", str(kubeconfig))
            assert code == 2
            assert err.startswith(f"error: cannot reach the Kubernetes API at https://127.0.0.1:{port}: ")
            assert err.count("\n") == 1 and "Traceback" not in err
    assert cli.default_namespace(str(kubeconfig)) == "team-a", "the context's namespace, like kubectl"


@pytest.mark.parametrize("argv", [[], ["rollout"], ["rollout", "undo"], ["rollout", "restart", "tiny"],
                                  ["rollout", "status", "tiny", "--timeout", "soon"]])
def test_bad_usage_exits_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(argv)
    assert exit_.value.code == 2
    assert "usage: pdfleet" in capsys.readouterr().err


@pytest.mark.parametrize(("text", "seconds"), [("30s", 30.0), ("1h30m", 5400.0), ("0", None), ("0s", None)])
def test_timeouts_read_like_kubectls(text: str, seconds: float | None) -> None:
    assert cli._timeout(text) == seconds


# --- the reads, against a fake apiserver on 127.0.0.1 ---------------------------------------------------------


NO_SUCH_API = {"reason": "NotFound", "message": "the server could not find the requested resource"}


class FakeApiserver:
    """Answers the CLI's reads of pool `tiny` in namespace `ns` as `routes` says: path -> (status, body or list of
    watch events, sent in small chunks so an event spans several)."""

    def __init__(self, routes: dict[str, tuple[int, Any]]) -> None:
        self.routes = routes
        self.queries: list[dict[str, str]] = []

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.queries.append(dict(request.query))
        status, body = self.routes.get(request.path, (404, NO_SUCH_API))
        if not isinstance(body, list):
            return web.json_response(body, status=status)
        response = web.StreamResponse(status=status)
        await response.prepare(request)
        data = b"".join(json.dumps(e).encode() + b"\n" for e in body)
        for i in range(0, len(data), 4096):
            await response.write(data[i:i + 4096])
        return response

    @contextlib.asynccontextmanager
    async def reader(self) -> AsyncIterator[PoolReader]:
        app = web.Application()
        app.router.add_route("GET", "/{tail:.*}", self.handle)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        host = f"http://127.0.0.1:{port}"
        client = KubeClient(k8s.Configuration(host=host))
        try:
            yield PoolReader(client, host, "ns", "tiny")
        finally:
            await client.close()
            await runner.cleanup()


POOL_PATH = "/apis/pdfleet.dev/v1alpha1/namespaces/ns/inferencepools"


async def read(routes: dict[str, tuple[int, Any]], use: Any) -> tuple[Any, FakeApiserver]:
    server = FakeApiserver(routes)
    async with server.reader() as reader:
        return await use(reader), server


async def test_a_missing_pool_and_a_missing_api_read_differently() -> None:
    missing = {f"{POOL_PATH}/tiny": (404, {"reason": "NotFound",
                                           "message": 'inferencepools.pdfleet.dev "tiny" not found'})}
    with pytest.raises(CliError, match=r'^InferencePool "tiny" not found in namespace "ns"$'):
        await read(missing, lambda r: r.pool())
    with pytest.raises(CliError, match=r"^the InferencePool API \(pdfleet.dev/v1alpha1\) is not installed"):
        await read({}, lambda r: r.pool())
    denied = {f"{POOL_PATH}/tiny": (403, {"reason": "Forbidden", "message": "no"})}
    with pytest.raises(CliError, match=r"^forbidden: no$"):
        await read(denied, lambda r: r.pool())


async def collect(reader: PoolReader) -> list[Body]:
    return [e async for e in reader.watch("7")]


async def test_the_watch_yields_whole_events_however_they_are_chunked_and_ends_on_410() -> None:
    big = {"metadata": {"name": "tiny", "resourceVersion": "8"}, "status": {"blob": "x" * 300_000}}
    events = [{"type": "MODIFIED", "object": big}, {"type": "MODIFIED", "object": {"metadata": {"name": "tiny"}}},
              {"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired", "message": "old"}},
              {"type": "MODIFIED", "object": {"never": "seen"}}]
    got, server = await read({POOL_PATH: (200, events)}, collect)
    assert got == events[:2]
    assert server.queries == [{"fieldSelector": "metadata.name=tiny", "resourceVersion": "7",
                               "timeoutSeconds": "300", "watch": "1"}]
    with pytest.raises(CliError, match=r"^forbidden: nope$"):
        await read({POOL_PATH: (403, {"reason": "Forbidden", "message": "nope"})}, collect)
