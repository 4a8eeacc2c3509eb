"""The real sglang 0.5.23 is installed and usable on this CPU-only machine (hack/install-sglang.sh).

These tests fail, never skip, when sglang is missing: everything that checks pdfleet against SGLang's own
code depends on it. Heavy imports run in a child process so that the test process keeps its own state.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
REQUIREMENTS = REPO / "requirements" / "sglang-cpu.txt"
SGLANG_VERSION = "0.5.23"
INSTALL_HINT = (
    f"sglang {SGLANG_VERSION} is not installed in {sys.executable}'s environment: "
    "run hack/install-sglang.sh (it installs requirements/sglang-cpu.txt with --no-deps)"
)

MODULES = [
    "sglang",
    "sglang.srt.server_args",
    "sglang.srt.utils",
    "sglang.srt.managers.scheduler",
    "sglang.srt.managers.scheduler_components.request_receiver",
    "sglang.srt.managers.detokenizer_manager",
    "sglang.srt.disaggregation.utils",
    "sglang.srt.disaggregation.prefill",
    "sglang.srt.disaggregation.decode",
    "sglang.srt.function_call.deepseekv4_detector",
    "sglang.srt.function_call.deepseekv32_detector",
    "sglang.srt.entrypoints.http_server",
    "sglang.srt.entrypoints.openai.serving_deepseek_recipe",
    "deepseek_recipe",
    "triton",
    "sglang_router",
]

# Names pdfleet relies on (runtime patches and rank-health instrumentation), as they are in 0.5.23.
SYMBOLS = {
    "sglang.srt.utils": ["broadcast_pyobj"],
    "sglang.srt.utils.common": ["broadcast_pyobj"],
    "sglang.srt.disaggregation.utils": ["poll_and_all_reduce", "all_reduce_flags"],
    "sglang.srt.managers.scheduler": ["Scheduler", "dispatch_event_loop", "_dispatch_event_loop_once"],
    "sglang.srt.managers.scheduler_components.request_receiver": ["broadcast_pyobj"],
}
EVENT_LOOPS = [
    "event_loop_normal",
    "event_loop_overlap",
    "event_loop_normal_disagg_prefill",
    "event_loop_overlap_disagg_prefill",
    "event_loop_pp_disagg_prefill",
    "event_loop_normal_disagg_decode",
    "event_loop_overlap_disagg_decode",
    "event_loop_pp_disagg_decode",
]

_REPORT_SCRIPT = r"""
import importlib, json, sys, warnings
warnings.simplefilter("ignore")
modules, symbols, loops = json.loads(sys.argv[1])
report = {"modules": {}, "symbols": {}, "loops": {}}
for name in modules:
    try:
        importlib.import_module(name)
        report["modules"][name] = None
    except BaseException as exc:  # report, don't die: each module gets its own verdict
        report["modules"][name] = f"{type(exc).__name__}: {exc}"
for module, names in symbols.items():
    mod = sys.modules.get(module)
    report["symbols"][module] = {n: mod is not None and callable(getattr(mod, n, None)) for n in names}
scheduler = sys.modules.get("sglang.srt.managers.scheduler")
for loop in loops:
    report["loops"][loop] = scheduler is not None and callable(getattr(scheduler.Scheduler, loop, None))
import sglang, torch
report["sglang_version"] = sglang.__version__
report["torch_version"] = torch.__version__
report["cuda_available"] = torch.cuda.is_available()
report["gloo_available"] = torch.distributed.is_gloo_available()
print("REPORT " + json.dumps(report))
"""

# One rank of a 2-process gloo group on 127.0.0.1. argv: rank world_size port mode
_RANK_SCRIPT = r"""
import datetime, json, sys
import torch
import torch.distributed as dist
rank, world, port, mode = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
dist.init_process_group(
    "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
    timeout=datetime.timedelta(seconds=60),
)
out = {"rank": rank}
try:
    group = dist.new_group(backend="gloo")
    t = torch.tensor([rank + 1], dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.SUM, group=group)
    out["sum"] = t.item()
    t = torch.tensor([rank + 1], dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.MIN, group=group)
    out["min"] = t.item()
    objs = [{"from": rank}] if rank == 0 else [None]
    dist.broadcast_object_list(objs, src=0, group=group)
    out["object"] = objs[0]
    if mode == "sglang":
        from sglang.srt.utils import broadcast_pyobj
        from sglang.srt.disaggregation.utils import poll_and_all_reduce

        class Poller:
            def __init__(self, state):
                self.state = state

            def poll(self):
                return self.state

        # rank 0 sends a request list, as recv_requests does every scheduler iteration
        out["broadcast_pyobj"] = broadcast_pyobj(["req-a", "req-b"] if rank == 0 else [], rank, group, src=0)
        # KV poll states (KVPoll ints): the MIN across ranks, as the disaggregation loops agree on it
        out["polls"] = poll_and_all_reduce([Poller(4), Poller(2 + rank)], group)
    dist.barrier(group=group)
finally:
    dist.destroy_process_group()
print("RESULT " + json.dumps(out), flush=True)
"""


def _require_sglang() -> None:
    try:
        version: str | None = importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        version = None
    if version is None:
        pytest.fail(INSTALL_HINT, pytrace=False)
    if version != SGLANG_VERSION:
        pytest.fail(
            f"sglang {version} is installed, pdfleet tests need {SGLANG_VERSION}: {INSTALL_HINT}", pytrace=False
        )


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["GLOO_SOCKET_IFNAME"] = "lo"  # keep gloo's pair connections on loopback
    env["PYTHONWARNINGS"] = "ignore"
    env["HF_HUB_OFFLINE"] = "1"
    return env


def _pins() -> dict[str, str]:
    pins: dict[str, str] = {}
    for raw in REQUIREMENTS.read_text(encoding="utf-8").splitlines():
        line = raw.split("#", 1)[0].strip()
        if line:
            name, sep, version = line.partition("==")
            assert sep, f"{REQUIREMENTS.name}: not an exact pin: {raw!r}"
            pins[name] = version
    return pins


@pytest.fixture(scope="module")
def report() -> dict[str, Any]:
    try:
        importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return {}  # each test then fails through _require_sglang(), with the install hint
    proc = subprocess.run(
        [sys.executable, "-c", _REPORT_SCRIPT, json.dumps([MODULES, SYMBOLS, EVENT_LOOPS])],
        capture_output=True,
        text=True,
        timeout=300,
        env=_child_env(),
        cwd=REPO,
        check=False,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("REPORT ")]
    if proc.returncode != 0 or not lines:
        pytest.fail(f"the import probe failed (rc={proc.returncode}):\n{proc.stderr[-4000:]}", pytrace=False)
    return json.loads(lines[-1].removeprefix("REPORT "))


def test_sglang_version_is_pinned() -> None:
    _require_sglang()
    assert _pins()["sglang"] == SGLANG_VERSION


def test_every_pinned_package_is_installed() -> None:
    _require_sglang()
    wrong = []
    for name, version in _pins().items():
        try:
            have = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            have = "not installed"
        if have != version:
            wrong.append(f"{name}=={version} ({have})")
    assert not wrong, f"run hack/install-sglang.sh; these pins do not match: {', '.join(wrong)}"


def test_sglang_reports_its_version(report: dict[str, Any]) -> None:
    _require_sglang()
    assert report["sglang_version"] == SGLANG_VERSION


def test_torch_is_the_pinned_build_and_runs_without_cuda(report: dict[str, Any]) -> None:
    _require_sglang()
    assert report["torch_version"].split("+")[0] == _pins()["torch"]
    assert report["cuda_available"] is False
    assert report["gloo_available"] is True


@pytest.mark.parametrize("module", MODULES)
def test_module_imports(report: dict[str, Any], module: str) -> None:
    _require_sglang()
    error = report["modules"][module]
    assert error is None, f"import {module} failed: {error}"


@pytest.mark.parametrize("module", sorted(SYMBOLS))
def test_symbols_pdfleet_relies_on(report: dict[str, Any], module: str) -> None:
    _require_sglang()
    missing = [name for name, ok in report["symbols"][module].items() if not ok]
    assert not missing, f"{module} lacks {missing} in sglang {SGLANG_VERSION}"


def test_scheduler_event_loops(report: dict[str, Any]) -> None:
    _require_sglang()
    missing = [loop for loop, ok in report["loops"].items() if not ok]
    assert not missing, f"Scheduler lacks {missing}"


def test_router_cli_runs() -> None:
    _require_sglang()
    proc = subprocess.run(
        [sys.executable, "-m", "sglang_router.launch_router", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        env=_child_env(),
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    for flag in ("--pd-disaggregation", "--prefill", "--decode", "--prefill-policy", "--decode-policy"):
        assert flag in proc.stdout


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def spawn_ranks() -> Iterator[list[subprocess.Popen[str]]]:
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for proc in procs:  # always cleaned up, whatever the test did
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)


@pytest.mark.parametrize("mode", ["torch", "sglang"])
def test_two_process_gloo_group(spawn_ranks: list[subprocess.Popen[str]], mode: str) -> None:
    _require_sglang()
    world, port = 2, _free_port()
    for rank in range(world):
        spawn_ranks.append(
            subprocess.Popen(
                [sys.executable, "-c", _RANK_SCRIPT, str(rank), str(world), str(port), mode],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=_child_env(),
                cwd=REPO,
            )
        )
    results = []
    for proc in spawn_ranks:
        try:
            stdout, stderr = proc.communicate(timeout=240)
        except subprocess.TimeoutExpired:
            pytest.fail(f"rank pid {proc.pid} did not finish in 240 s (gloo hang?)", pytrace=False)
        assert proc.returncode == 0, f"rank failed (rc={proc.returncode}):\n{stderr[-4000:]}"
        line = [ln for ln in stdout.splitlines() if ln.startswith("RESULT ")][-1]
        results.append(json.loads(line.removeprefix("RESULT ")))
    for rank, out in enumerate(results):
        assert out["rank"] == rank
        assert out["sum"] == 3
        assert out["min"] == 1
        assert out["object"] == {"from": 0}
        if mode == "sglang":
            assert out["broadcast_pyobj"] == ["req-a", "req-b"]
            assert out["polls"] == [4, 2]
