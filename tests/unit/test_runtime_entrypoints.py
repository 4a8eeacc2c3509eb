"""The engine pod's entrypoints: the runtime installs into a volume and runs from it on a bare Python, and the
launcher serves the rank-health agent with `/livez` on the pod's agent port."""

from __future__ import annotations

import inspect
import json
import os
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

import pdfleet.runtime
from pdfleet.runtime import drain, install, launcher, refused_routes, server_info_redaction
from pdfleet.runtime.health import agent, ledger
from pdfleet.runtime.instrument import seams
from pdfleet.runtime.patches import catalogue, targets
from tests.support import refused_sglang_routes, requires
from tests.support.ports import free_port

ROOT = Path(__file__).resolve().parents[2]


def bare_python(*args: str, lib: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    """A Python without site-packages (`-S`: no sglang, no pydantic, no editable pdfleet) whose only extra
    path is the installed runtime, as in an engine container before SGLang is imported."""
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(lib), "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run([sys.executable, "-S", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=60)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    dest = tmp_path_factory.mktemp("volume")
    result = subprocess.run([sys.executable, "-m", "pdfleet.runtime.install", str(dest)], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return dest


def files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


def test_the_install_holds_the_runtime_and_the_kernels_as_a_namespace_package(installed: Path) -> None:
    namespace = installed / "lib" / "pdfleet"
    assert sorted(p.name for p in namespace.iterdir()) == ["kernels", "runtime"]
    for name, source in (("runtime", Path(pdfleet.runtime.__file__).parent), ("kernels", ROOT / "kernels")):
        expected = {f for f in files(source) if "__pycache__" not in f and not f.endswith(".pyc")}
        assert files(namespace / name) == expected
    assert (namespace / "runtime" / "bootstrap" / "sitecustomize.py").is_file()
    assert (namespace / "kernels" / "paged.py").is_file()


def test_the_installed_launcher_lists_the_catalogue_on_a_bare_python(installed: Path, tmp_path: Path) -> None:
    result = bare_python("-m", "pdfleet.runtime.launcher", "patches", lib=installed / "lib", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    for pid in catalogue.IDS:
        assert pid in result.stdout


def test_every_installed_module_imports_with_the_standard_library_alone(installed: Path, tmp_path: Path) -> None:
    # The engine simulator is the exception: it serves HTTP with aiohttp, which every SGLang image has (SGLang
    # depends on it), and only ever runs when PDFLEET_ENGINE_MODE=simulate asks for it.
    runtime = installed / "lib" / "pdfleet" / "runtime"
    modules = sorted("pdfleet.runtime." + ".".join(p.relative_to(runtime).with_suffix("").parts).removesuffix(
        ".__init__") for p in runtime.rglob("*.py") if p.parent.name != "bootstrap" and "simulator" not in p.parts)
    script = ("import importlib, sys\n"
              f"for m in {modules!r}: importlib.import_module(m.removesuffix('.'))\n"
              "import pdfleet.runtime as r; print(r.__file__)\n"
              "assert not any(n.split('.')[0] in ('sglang', 'torch', 'pydantic', 'kopf') for n in sys.modules)")
    result = bare_python("-c", script, lib=installed / "lib", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().startswith(str(runtime))


def test_installing_again_replaces_the_runtime_in_place(tmp_path: Path) -> None:
    first = install.install(tmp_path)
    (first / "stale.py").write_text("")
    second = install.install(tmp_path)
    assert second == first and not (second / "stale.py").exists()
    assert sorted(p.name for p in (tmp_path / "lib" / "pdfleet").iterdir()) == ["kernels", "runtime"]


# --- the agent the launcher starts ----------------------------------------------------------------------

def get(url: str) -> tuple[int, Any]:
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.status, json.loads(response.read())


def test_agent_port_zero_starts_no_agent() -> None:
    assert launcher.start_agent(0) is None


def test_the_pod_agent_answers_livez_and_still_serves_the_ranks(tmp_path: Path) -> None:
    with agent.Agent(tmp_path / "ledger", host="127.0.0.1", port=0) as running:
        assert get(f"http://127.0.0.1:{running.port}/livez") == (200, {"alive": True})
        status, body = get(f"http://127.0.0.1:{running.port}/ranks")
        assert status == 200 and body["ranks"] == []


@pytest.fixture
def launched(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[dict[str, Any]]:
    """`launcher.main` in run mode, up to SGLang's `run_server`, which is replaced by a probe of the pod as
    the engine would find it. Restores SGLang's patched functions, the environment, and stops the agent."""
    sglang_server = requires.module("sglang.launch_server")
    requires.module("sglang.srt.managers.scheduler")
    from pdfleet.runtime.instrument import rank_seams
    from pdfleet.runtime.patches.impl import overlap_loop_report

    for dotted in (*rank_seams.FINGERPRINTS["0.5.23"], overlap_loop_report.TARGET):
        t = targets.resolve(dotted)
        monkeypatch.setattr(t.owner, t.attr, t.function)
    monkeypatch.setattr(seams, "_writer", seams.UNATTACHED)
    http_server = refused_sglang_routes.restored_after(monkeypatch)
    for name in ("PYTHONPATH", "PDFLEET_PATCHES"):
        monkeypatch.setenv(name, os.environ.get(name, ""))
    monkeypatch.setenv(ledger.PATH_ENV, str(tmp_path / "ledger"))
    seen: dict[str, Any] = {}
    agents: list[agent.Agent] = []
    real_start = launcher.start_agent

    def start_agent(port: int, *, host: str = "0.0.0.0", patches: Sequence[str] = ()) -> agent.Agent | None:
        running = real_start(port, host="127.0.0.1", patches=patches)
        if running is not None:
            agents.append(running)
        return running

    def run_server(server_args: Any) -> None:
        seen["livez"] = get(f"http://127.0.0.1:{seen['port']}/livez")
        seen["ranks"] = get(f"http://127.0.0.1:{seen['port']}/ranks")
        seen["ledger_exists"] = (tmp_path / "ledger").exists()
        seen["endpoint"] = json.loads(drain.endpoint_path().read_text())
        wanted = {(x.path, x.methods) for x in refused_routes.REFUSED} | {(server_info_redaction.PATH,
                                                                            frozenset({"GET"}))}
        seen["refused"] = {key: getattr(r.endpoint, "__pdfleet_patch__", None) for r in http_server.app.router.routes
                           if (key := (getattr(r, "path", None), frozenset(getattr(r, "methods", None) or ())))
                           in wanted}

    monkeypatch.setattr(launcher, "start_agent", start_agent)
    monkeypatch.setattr(sglang_server, "run_server", run_server)
    seen["port"] = free_port()
    yield seen
    for running in agents:
        running.stop()


def test_the_launcher_serves_livez_on_the_agent_port_before_sglang_starts(
        launched: dict[str, Any], tmp_path: Path) -> None:
    (tmp_path / "ledger").write_bytes(b"a stale ledger of another engine")
    code = launcher.main([f"--agent-port={launched['port']}", "--", "--model-path", "/m", "--port", "31000",
                          "--disaggregation-mode", "decode"])
    assert code == 0
    assert launched["livez"] == (200, {"alive": True})
    assert launched["ranks"][1]["patches"] == []  # the agent says which patches the engine runs: none asked
    assert launched["ledger_exists"] is False
    assert launched["endpoint"] == {"url": "http://127.0.0.1:31000"}
    # The app run_server would serve already refuses what no pdfleet engine runs.
    assert launched["refused"] == {(r.path, r.methods): refused_routes.ID for r in refused_routes.REFUSED} | {
        (server_info_redaction.PATH, frozenset({"GET"})): server_info_redaction.ID}
    assert os.environ["PDFLEET_PATCHES"] == ""


def test_the_launcher_refuses_to_start_when_the_agent_port_is_taken(launched: dict[str, Any]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code = launcher.main([f"--agent-port={port}", "--", "--model-path", "/m"])
    assert code == launcher.EXIT_USAGE
    assert "livez" not in launched


def test_the_launcher_stops_with_one_line_when_a_refused_route_changed(
        launched: dict[str, Any], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    http_server = requires.module(refused_routes.MODULE)
    changed = inspect.unwrap(http_server.update_weights_from_disk)
    real_getsource = inspect.getsource

    def getsource(obj: Any) -> str:
        text = real_getsource(obj)
        return text + "    return None\n" if obj is changed else text

    monkeypatch.setattr(targets.inspect, "getsource", getsource)
    code = launcher.main(["--check", "--", "--model-path", "/m"])
    assert code == launcher.EXIT_USAGE
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("pdfleet-engine: refused-routes: sglang.srt.entrypoints.http_server."
                               "update_weights_from_disk is not the function")


def test_a_spawned_rank_process_gets_the_instrumentation_when_it_imports_the_scheduler(tmp_path: Path) -> None:
    requires.installed("sglang")
    env = {**os.environ, "PDFLEET_PATCHES": "", "PYTHONWARNINGS": "ignore",
           "PYTHONPATH": os.pathsep.join(p for p in (str(launcher.BOOTSTRAP), os.environ.get("PYTHONPATH")) if p)}
    script = ("import sglang.srt.managers.scheduler as s\n"
              "print(s._dispatch_event_loop_once.__pdfleet_patch__, s.Scheduler.run_batch.__pdfleet_patch__)")
    result = subprocess.run([sys.executable, "-c", script], env=env, cwd=tmp_path, capture_output=True, text=True,
                            timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["overlap-loop-report", "rank-instrumentation"]


def test_a_process_that_imports_sglangs_http_server_serves_the_refused_routes(tmp_path: Path) -> None:
    # As a tokenizer worker does (--tokenizer-worker-num > 1): it re-imports the app by its module path.
    requires.installed("sglang")
    env = {**os.environ, "PDFLEET_PATCHES": "", "PYTHONWARNINGS": "ignore",
           "PYTHONPATH": os.pathsep.join(p for p in (str(launcher.BOOTSTRAP), os.environ.get("PYTHONPATH")) if p)}
    paths = (*(r.path for r in refused_routes.REFUSED), server_info_redaction.PATH)
    script = ("import sglang.srt.entrypoints.http_server as h\n"
              "for r in h.app.router.routes:\n"
              f"    if getattr(r, 'path', None) in {paths!r}:\n"
              "        print(r.path, ','.join(sorted(r.methods)), getattr(r.endpoint, '__pdfleet_patch__', None))")
    result = subprocess.run([sys.executable, "-c", script], env=env, cwd=tmp_path, capture_output=True, text=True,
                            timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    assert set(result.stdout.splitlines()) == {
        *(f"{r.path} {','.join(sorted(r.methods))} {refused_routes.ID}" for r in refused_routes.REFUSED),
        f"{server_info_redaction.PATH} GET {server_info_redaction.ID}",
        "/hicache/storage-backend GET None"}  # a read, SGLang's own


def test_a_runtime_without_its_bootstrap_is_refused_instead_of_installed(tmp_path: Path) -> None:
    source = tmp_path / "runtime"
    source.mkdir()
    (source / "launcher.py").write_text("")
    with pytest.raises(install.InstallError, match=r"bootstrap/sitecustomize\.py"):
        install.install(tmp_path / "dest", source=source)
    assert not (tmp_path / "dest").exists()


def test_a_runtime_without_its_kernels_is_refused_instead_of_installed(tmp_path: Path) -> None:
    # The bf16-index-keys patch imports pdfleet.kernels inside the engine; a volume without them would fail there.
    with pytest.raises(install.InstallError, match=r"no pdfleet\.kernels package"):
        install.install(tmp_path / "dest", kernels=tmp_path / "absent")
    assert not (tmp_path / "dest").exists()
