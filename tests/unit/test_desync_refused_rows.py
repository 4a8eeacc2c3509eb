"""Features docs/desync-audit.md settles by refusing them, shown on SGLang 0.5.23's own code: that the feature decides
per TP rank what the group must agree, and, for those refused by their flags at admission, that its flags are the
only way to turn it on and that pdfleet refuses each spelling SGLang's parser takes for them.

- LoRA (`--enable-lora`, `--lora-paths`): the batch preparation's all-gather (`LoRAManager.prepare_lora_batch`)
  is the row the scan reaches; the per-rank decisions are around it: a starving adapter's drain decided on each
  rank's own clock (prefill admission), an asynchronously copied adapter's readiness read from this rank's CUDA
  event (prefill admission and decode preallocation), and an adapter load's outcome, which only the TP leader
  reports.
- FlexKV (`--enable-flexkv`, `--radix-cache-backend`): the rows the scan reaches (`FlexKVComm._isend` / `_recv`)
  are its TP fan-out, not only PP: the leader's answers go out by isends that each follower receives in call
  order, and an eviction one rank's own free KV asks for drains store completions through it (on the installed
  source, and SGLang's own FlexKVComm on real gloo ranks: tests/repro/flexkv.py).
- HiCache storage attached/detached at run time (served by SGLang only with `--admin-api-key`, which a pool may
  set: every pdfleet engine refuses the two routes, tests/unit/test_refused_routes.py): the scheduler's handlers
  decide on this rank's own idleness before the controller creates groups.

Refused at the engine rather than by a flag (docs/desync-audit.md items 13 and 14: their endpoints take no key, and
every engine pdfleet starts answers them 403, `pdfleet.runtime.refused_routes`, tested in
tests/unit/test_refused_routes.py):
- A weight update from disk whose load fails on one rank (SGLang's own `update_weights_from_disk`): that rank skips
  the recapture and flush its peers run, and its "rollback" re-reads the new checkpoint.
- An external ngram corpus each rank installs and commits when its own loader thread finishes (SGLang's own
  `ExternalCorpusManager`, and the native loader's source).
"""

from __future__ import annotations

import ast
import inspect
import pathlib
import textwrap
from types import SimpleNamespace
from typing import Any

import pytest

from tests.support import requires

_BASE = ["--model-path", "/models/tiny", "--disaggregation-mode", "decode"]


def _lora_enabled(argv: list[str]) -> bool:
    """Whether SGLang turns LoRA on for these arguments, as its own resolution step decides it."""
    from sglang.srt.arg_groups.lora_hook import check_lora_server_args
    from sglang.srt.arg_groups.overrides import resolving_view
    from sglang.srt.server_args import prepare_server_args

    args = prepare_server_args([*_BASE, *argv])
    check_lora_server_args(args)
    return bool(resolving_view(args).enable_lora)


def _refusals(extra_args: list[str]) -> list[tuple[str, str]]:
    from pdfleet.operator.api import validate
    from tests.unit.test_api_rejections import merged, minimal_spec

    problems = validate({"spec": merged(minimal_spec(), {"engine": {"extraArgs": extra_args}})})
    return [(p.path, p.message) for p in problems]


def test_lora_is_turned_on_only_by_the_flags_pdfleet_refuses() -> None:
    requires.installed("sglang")
    assert not _lora_enabled([])  # SGLang's default
    # The other LoRA flags, free in extraArgs, leave it off.
    others = ["--max-lora-rank", "8", "--lora-target-modules", "all", "--max-loaded-loras", "8",
              "--lora-drain-wait-threshold", "1", "--lora-eviction-policy", "fifo"]
    assert not _lora_enabled(others) and _refusals(others) == []
    # Every spelling that turns it on, abbreviations SGLang's argparse takes included, is refused by name.
    spellings = {"--enable-lora": ["--enable-lora", *others], "--lora-paths": ["--lora-paths", "a=/models/a"],
                 "--lora-p": ["--lora-p", "a=/models/a"], "--lora-pa=a=/models/a": ["--lora-pa=a=/models/a"]}
    for spelling, argv in spellings.items():
        assert _lora_enabled(argv), spelling
        flag = "--enable-lora" if spelling == "--enable-lora" else "--lora-paths"
        assert [(path, f"extraArgs may not set {flag}" in message) for path, message in _refusals([spelling])] == \
            [("spec.engine.extraArgs[0]", True)], spelling


def test_without_lora_no_manager_is_built_and_the_adapter_handlers_refuse(monkeypatch: pytest.MonkeyPatch) -> None:
    """The batch preparation's all-gather is reached only through `model_runner.lora_manager`, built only with
    LoRA on (or by UNO's draft, which loads its one adapter at start and does not support DP attention, without
    which the gather is not entered); SGLang's own load/unload handlers refuse before reaching any rank."""
    requires.installed("sglang")
    import asyncio

    from sglang.srt.lora.lora_manager import LoRAManager
    from sglang.srt.managers import tokenizer_control_mixin as control
    from sglang.srt.managers.io_struct import LoadLoRAAdapterReqInput, UnloadLoRAAdapterReqInput
    from sglang.srt.model_executor.model_runner import ModelRunner

    body = textwrap.dedent(inspect.getsource(ModelRunner.maybe_init_lora_manager))
    assert "if get_lora().enable_lora and not self.is_draft_worker:\n        self.init_lora_manager()" in body
    assert body.index("if self.spec_algorithm.is_uno():") < body.index("get_lora().enable_lora")
    prepare = inspect.getsource(LoRAManager.prepare_lora_batch)
    assert prepare.index("if self.attn_dp_enabled:") < prepare.index("all_gather_object(")

    monkeypatch.setattr(control, "get_lora", lambda: SimpleNamespace(enable_lora=None))
    manager = SimpleNamespace(auto_create_handle_loop=lambda: None)  # no rank is reached: nothing else is used
    for handler, request in ((control.TokenizerControlMixin.load_lora_adapter,
                              LoadLoRAAdapterReqInput(lora_name="a", lora_path="/models/a")),
                             (control.TokenizerControlMixin.unload_lora_adapter,
                              UnloadLoRAAdapterReqInput(lora_name="a"))):
        result = asyncio.run(handler(manager, request))
        assert not result.success and "LoRA is not enabled" in result.error_message, handler


def _waiting(lora_id: str, entered: float, max_new_tokens: int = 64) -> SimpleNamespace:
    return SimpleNamespace(lora_id=lora_id, time_stats=SimpleNamespace(wait_queue_entry_time=entered),
                           sampling_params=SimpleNamespace(max_new_tokens=max_new_tokens), output_ids=[])


def test_two_ranks_drain_a_lora_adapter_at_different_iterations_on_their_own_clocks(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """SGLang's own LoRADrainer (`--lora-drain-wait-threshold`), as prefill admission updates and
    asks it: each rank measures a waiting request's wait with its own `time.monotonic()` against the moment it
    queued the request. Two ranks holding the same queue, reading their clocks 1 ms apart around the threshold,
    disagree whether the running adapter drains, so one admits a request for it and the other does not."""
    requires.installed("sglang")
    from sglang.srt.lora import lora_drainer

    threshold, queued = 5.0, 100.0
    running = [SimpleNamespace(lora_id="A", sampling_params=SimpleNamespace(max_new_tokens=256), output_ids=[1])]
    clock = [0.0]
    monkeypatch.setattr(lora_drainer.time, "monotonic", lambda: clock[0])
    admits = []
    for now in (queued + threshold + 0.0005, queued + threshold - 0.0005):  # the same iteration on two ranks
        drainer = lora_drainer.LoRADrainer(max_loras_per_batch=1, max_wait_time_secs=threshold)
        clock[0] = now
        drainer.update_draining_state([_waiting("B", queued)], running)
        # A request for the running adapter, longer than a draining adapter may still take (255 tokens left).
        admits.append(drainer.can_schedule(_waiting("A", now, max_new_tokens=512)))
    assert admits == [False, True], "the first rank drains A for B, its peer still admits A"


def _calls(fn: Any) -> set[str]:
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    return {ast.unparse(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}


def test_lora_admission_reads_this_ranks_cuda_event_and_a_load_reports_this_ranks_outcome() -> None:
    """With overlap loading, admission's `can_schedule_lora_req` asks the overlap loader, which drains the copies
    whose CUDA event this rank sees completed (`event.query()`) before it answers LOADED or LOADING. A load is
    run on every rank from the broadcast, and `_load_lora_adapter` turns any exception into a failed result for
    this rank alone; only the TP leader has a socket to the tokenizer (the others' `SenderWrapper(None)`), whose
    registry then follows the leader's answer."""
    requires.installed("sglang")
    from sglang.srt.lora.lora_manager import LoRAManager
    from sglang.srt.lora.lora_overlap_loader import LoRAOverlapLoader
    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.managers.scheduler_components import ipc_channels

    assert "self.lora_overlap_loader.try_overlap_load_lora" in _calls(Scheduler.can_schedule_lora_req)
    assert "self._drain_completed_overlap_loads" in _calls(LoRAOverlapLoader.try_overlap_load_lora)
    assert "event.query" in _calls(LoRAOverlapLoader._drain_completed_overlap_loads)

    load = ast.parse(textwrap.dedent(inspect.getsource(LoRAManager._load_lora_adapter)))
    handlers = [h for n in ast.walk(load) if isinstance(n, ast.Try) for h in n.handlers]
    assert [ast.unparse(h.type) for h in handlers] == ["Exception"]
    assert "success=False" in ast.unparse(handlers[0])
    senders = inspect.getsource(ipc_channels)
    assert senders.count("send_to_tokenizer = SenderWrapper(None)") == 1


# --- FlexKV (`--enable-flexkv`, `--radix-cache-backend`) ---

def _method(owner: Any, name: str) -> ast.FunctionDef:
    tree = ast.parse(textwrap.dedent(inspect.getsource(getattr(owner, name))))
    fn = tree.body[0]
    assert isinstance(fn, ast.FunctionDef)
    return fn


def _flexkv_methods(module: str, cls: str) -> dict[str, ast.FunctionDef]:
    """A FlexKV class's methods, read from the installed source: importing it needs the FlexKV package."""
    import sglang

    path = pathlib.Path(sglang.__file__).parent / "srt" / "mem_cache" / "storage" / "flexkv" / f"{module}.py"
    body = next(n for n in ast.parse(path.read_text()).body if isinstance(n, ast.ClassDef) and n.name == cls).body
    return {n.name: n for n in body if isinstance(n, ast.FunctionDef)}


def _called(fn: ast.FunctionDef) -> set[str]:
    return {ast.unparse(n.func) for n in ast.walk(fn) if isinstance(n, ast.Call)}


def _guards_of(fn: ast.FunctionDef, call: str) -> list[list[str]]:
    """For each call of `call` in `fn`, the tests of the `if`s around it, outermost first."""
    found: list[list[str]] = []

    def walk(node: ast.AST, tests: list[str]) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Call) and ast.unparse(child.func) == call:
                found.append(tests)
            inner = [*tests, ast.unparse(child.test)] if isinstance(child, ast.If) else tests
            walk(child, inner)

    walk(fn, [])
    return found


def test_flexkv_fans_out_over_tp_without_pp_and_a_rank_local_eviction_enters_it() -> None:
    """The scan's FlexKV rows (`FlexKVComm._isend` / `_recv`) are not PP-only: `scatter` sends the sync leader's
    payload to the TP ranks whenever attention TP is larger than one, the leader by non-blocking isends, each
    follower by a blocking receive of the next message with the TP tag, whatever call it is in. The connector's
    lookup, store-completion drain and prefetch steps all go through it (`needs_sync`: TP > 1), and the radix
    cache drains store completions from `evict`, which its load-back calls on this rank's own free KV."""
    requires.installed("sglang")
    comm = _flexkv_methods("flexkv_comm", "FlexKVComm")
    connector = _flexkv_methods("flexkv_connector", "FlexKVConnector")
    cache = _flexkv_methods("flexkv_radix_cache", "FlexKVRadixCache")

    assert _guards_of(comm["scatter"], "self._scatter_group") == [
        ["self.pp_size > 1 and self.is_pp_stage_leader"], ["self._cp_leader_ranks"], ["self._tp_group_ranks"]]
    init = ast.unparse(comm["__init__"])
    assert "if self.attn_tp_size > 1:" in init and "self._tp_group_ranks = [dist.get_global_rank(" in init
    assert "self.needs_sync = self.pp_size > 1 or self.attn_tp_size > 1 or self.attn_cp_size > 1" in init
    group = ast.unparse(comm["_scatter_group"])
    assert "works.extend(self._isend(dst, data, tag, self._world_cpu_group))" in group
    assert "return self._recv(group_ranks[0], tag, self._world_cpu_group)" in group
    assert "dist.irecv(t_size, src=src, tag=tag, group=group).wait()" in ast.unparse(comm["_recv"])
    for step in ("lookup_kv", "check_completed_stores", "prefetch_async", "check_prefetch_progress"):
        assert _guards_of(connector[step], "self._sync_ctx.scatter") == [["self._sync_ctx.needs_sync"]], step
    assert "self._drain_completed_stores" in _called(cache["evict"])
    assert "self.flexkv_connector.check_completed_stores" in _called(cache["_drain_completed_stores"])
    assert _guards_of(cache["_allocate_and_load"], "self.evict") == [
        ["self.token_to_kv_pool_allocator.available_size() < uncached_len"]]


def test_flexkv_is_turned_on_only_by_the_flags_pdfleet_refuses() -> None:
    """SGLang builds FlexKV's radix cache from `--enable-flexkv` (the default factory chain) or from a name given
    to `--radix-cache-backend` (the registry), and the only name SGLang 0.5.23 registers is FlexKV's."""
    requires.installed("sglang")
    import sglang
    from sglang.srt.mem_cache import registry
    from sglang.srt.server_args import prepare_server_args

    default = prepare_server_args(_BASE)
    assert (default.enable_flexkv, default.radix_cache_backend) == (False, None)  # SGLang's defaults
    for spelling in ("--enable-flexkv", "--enable-flex"):  # argparse takes the prefix for the flag
        assert prepare_server_args([*_BASE, spelling]).enable_flexkv is True
        assert [(path, "extraArgs may not set --enable-flexkv" in message)
                for path, message in _refusals([spelling])] == [("spec.engine.extraArgs[0]", True)], spelling
    for spelling in ("--radix-cache-backend=flexkv", "--radix-cache-b=flexkv"):
        assert prepare_server_args([*_BASE, spelling]).radix_cache_backend == "flexkv"
        assert [(path, "extraArgs may not set --radix-cache-backend" in message)
                for path, message in _refusals([spelling])] == [("spec.engine.extraArgs[0]", True)], spelling

    chain = ast.unparse(_method(registry, "default_radix_cache_factory"))
    assert chain.count("_flexkv_factory") == 2 and "if get_memory().enable_flexkv:" in chain
    assert "if name:\n        factory = get_radix_cache_factory(name)" in ast.unparse(
        _method(registry, "create_tree_cache"))
    srt = pathlib.Path(sglang.__file__).parent / "srt"
    registering = {str(path.relative_to(srt)) for path in srt.rglob("*.py")
                   if "register_radix_cache_backend(" in (text := path.read_text())
                   and any(isinstance(n, ast.Call) and ast.unparse(n.func) == "register_radix_cache_backend"
                           for n in ast.walk(ast.parse(text)))}
    assert registering == {"mem_cache/storage/flexkv/__init__.py"}


@pytest.mark.parametrize("world", [2, 3])
def test_a_flexkv_fan_out_one_rank_enters_alone_mis_pairs_the_next_answer(launch: Any, world: int) -> None:
    """SGLang's own FlexKVComm on a real gloo group (tests/repro/flexkv.py). When every rank is short of free KV
    for a load-back, all drain the store completions and every later answer reaches its call. When only the last
    rank is, its drain receives the leader's next lookup answer (a dict where a list of handles belongs) and its
    own next lookup waits for a send the leader never makes; no error is raised where the pairing went wrong."""
    requires.installed("sglang")
    import json

    from tests.repro import flexkv
    from tests.repro.group import wait_for
    from tests.unit.test_desync_reproduction import _log

    sc, proc = launch((), world, module="tests.repro.flexkv", local_aborts={},
                      kv_free={rank: flexkv.LOAD_BACK // 2 for rank in range(world)})
    assert proc.wait(timeout=180) == 0, f"a rank hung or failed:\n{_log(sc)}"
    agreed = [json.loads(sc.result_path(rank).read_text()) for rank in range(world)]
    assert [(r["lookup"], r["drained"], r["next_lookup"]) for r in agreed] == \
        [(flexkv.FIRST_LOOKUP, flexkv.COMPLETED, flexkv.NEXT_LOOKUP)] * world

    sc, proc = launch((), world, module="tests.repro.flexkv", local_aborts={},
                      kv_free={world - 1: flexkv.LOAD_BACK // 2})

    def records() -> list[dict[str, Any]]:
        return [json.loads(path.read_text()) if (path := sc.result_path(rank)).exists() else {}
                for rank in range(world)]

    def settled() -> bool:
        *peers, last = records()
        return all(r.get("in") == "done" for r in peers) and last.get("in") == "next_lookup"

    assert wait_for(settled, timeout_s=120), f"the ranks did not reach their steps: {records()}\n{_log(sc)}"
    *peers, last = records()
    assert [(r["evicted"], r["lookup"], r["next_lookup"]) for r in peers] == \
        [(False, flexkv.FIRST_LOOKUP, flexkv.NEXT_LOOKUP)] * (world - 1)
    assert (last["evicted"], last["lookup"], last["drained"]) == (True, flexkv.FIRST_LOOKUP, flexkv.NEXT_LOOKUP), \
        "the last rank's store drain took the leader's next lookup answer"
    assert "next_lookup" not in last, "its own next lookup has no answer coming"


# --- HiCache storage attached or detached at run time (`--admin-api-key`) ---

def test_hicache_storage_attach_and_detach_reach_no_rank_without_an_admin_key(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """SGLang's own HTTP handlers for PUT/DELETE /hicache/storage-backend answer 400 before reaching the
    tokenizer (so no rank) unless the server has an admin key, which `--admin-api-key` (or an abbreviation SGLang's
    argparse takes) sets. Admission takes every spelling: the engine refuses the two routes themselves."""
    requires.installed("sglang")
    import asyncio

    from sglang.srt.entrypoints import http_server
    from sglang.srt.managers.io_struct import AttachHiCacheStorageReqInput
    from sglang.srt.server_args import prepare_server_args

    class Unreached:
        def __getattr__(self, name: str) -> Any:
            raise AssertionError(f"the handler reached the tokenizer manager ({name})")

    monkeypatch.setattr(http_server, "get_serving", lambda: SimpleNamespace(admin_api_key=None))
    monkeypatch.setattr(http_server, "_global_state", SimpleNamespace(tokenizer_manager=Unreached()))
    attach = asyncio.run(http_server.attach_hicache_storage_backend(
        AttachHiCacheStorageReqInput(hicache_storage_backend="file")))
    detach = asyncio.run(http_server.detach_hicache_storage_backend())
    for response in (attach, detach):
        assert response.status_code == 400 and b"requires admin API key" in response.body

    assert prepare_server_args(_BASE).admin_api_key is None  # SGLang's default
    for spelling, argv in {"--admin-api-key": ["--admin-api-key", "k"], "--admin=k": ["--admin=k"]}.items():
        assert prepare_server_args([*_BASE, *argv]).admin_api_key == "k", spelling
        assert _refusals(argv) == [], spelling


def test_a_busy_rank_refuses_the_storage_attach_its_idle_peer_runs_and_the_attach_creates_groups(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """With a key, SGLang's own `Scheduler.attach_hicache_storage_wrapped` / `detach_..._wrapped` (dispatched from
    the broadcast on every rank) refuse on this rank's own `is_fully_idle()`, before the tree cache's attach,
    whose controller creates gloo groups over the TP ranks (`_create_sync_groups`: one
    `create_custom_parallel_group` per group), and detach, which destroys them: a rank busy when its peers are
    idle stays out of the group creation they enter."""
    requires.installed("sglang")
    from sglang.srt.managers import cache_controller
    from sglang.srt.managers import scheduler as scheduler_module
    from sglang.srt.managers.io_struct import AttachHiCacheStorageReqInput, DetachHiCacheStorageReqInput

    monkeypatch.setattr(scheduler_module, "get_serving", lambda: SimpleNamespace(served_model_name="tiny"))
    monkeypatch.setattr(scheduler_module, "get_context", lambda: SimpleNamespace(override=lambda *a, **k: None))
    entered: dict[str, list[str]] = {}
    for rank, idle in (("busy", False), ("idle", True)):
        calls = entered.setdefault(rank, [])
        tree_cache = SimpleNamespace(
            attach_storage_backend=lambda calls=calls, **kwargs: calls.append("attach") or (True, "attached"),
            detach_storage_backend=lambda calls=calls: calls.append("detach") or (True, "detached"))
        scheduler = SimpleNamespace(enable_hierarchical_cache=True, is_fully_idle=lambda idle=idle: idle,
                                    waiting_queue=[], running_batch=SimpleNamespace(reqs=[] if idle else [1]),
                                    tree_cache=tree_cache, enable_hicache_storage=False)
        attached = scheduler_module.Scheduler.attach_hicache_storage_wrapped(
            scheduler, AttachHiCacheStorageReqInput(hicache_storage_backend="file"))
        detached = scheduler_module.Scheduler.detach_hicache_storage_wrapped(scheduler, DetachHiCacheStorageReqInput())
        assert (attached.success, detached.success) == (idle, idle), rank
    assert entered == {"busy": [], "idle": ["attach", "detach"]}

    controller = ast.parse(textwrap.dedent(inspect.getsource(cache_controller.HiCacheController)))
    methods = {n.name: n for n in controller.body[0].body if isinstance(n, ast.FunctionDef)}
    assert "self._create_sync_groups" in _called(methods["attach_storage_backend"])
    assert "create_custom_parallel_group" in _called(methods["_create_sync_groups"])
    assert "self._destroy_sync_groups" in _called(methods["detach_storage_backend"])



@pytest.mark.parametrize("world", [2, 3])
def test_a_busy_rank_refusing_the_storage_attach_leaves_its_idle_peers_in_the_group_creation(
        launch: Any, world: int) -> None:
    """SGLang's own attach handler and group creation on a real gloo group (tests/repro/hicache_attach.py): with
    every rank idle, all attach (creating the sync group together) and take the next broadcast. With the last
    rank holding a retracted request, it refuses and enters the next broadcast while its peers wait in the group
    creation's world all-gather for it, until gloo's timeout (10 s here); SGLang's handler reports that timeout as
    a failed attach, and no rank completes the next broadcast."""
    requires.installed("sglang")
    import json

    from tests.repro import hicache_attach
    from tests.unit.test_desync_reproduction import _log

    sc, proc = launch((), world, module="tests.repro.hicache_attach", local_aborts={})
    assert proc.wait(timeout=180) == 0, f"a rank hung or failed:\n{_log(sc)}"
    agreed = [json.loads(sc.result_path(rank).read_text()) for rank in range(world)]
    assert [(r["attached"], r["received"], r["in"]) for r in agreed] == \
        [(True, hicache_attach.NEXT_REQUESTS, "done")] * world

    timeout_s = 10.0
    sc, proc = launch((), world, module="tests.repro.hicache_attach", local_aborts={},
                      retracted={world - 1: [0, 1]}, gloo_timeout_s=timeout_s)
    assert proc.wait(timeout=180) != 0, "the group went on as if every rank had attached"
    *peers, last = [json.loads(sc.result_path(rank).read_text()) for rank in range(world)]
    assert (last["busy"], last["attached"], last["in"]) == (True, False, "broadcast"), last
    assert last["message"].startswith("Reject attach: scheduler is not idle")
    for peer in peers:
        assert (peer["busy"], peer["attached"], peer["in"]) == (False, False, "broadcast"), peer
        # Each peer waited in the group creation for gloo's timeout. A peer may then read its own timeout or, as
        # its wait ends, the closing of a connection whose other end gave up at the same moment (another peer at 3
        # ranks; seen at 2 ranks too, in a loaded suite): the group failed either way, after the full wait.
        assert any(why in peer["message"] for why in ("Timed out waiting", "Connection closed by peer")), peer
        assert peer["attach_s"] >= timeout_s * 0.9, peer


# --- Weights updated from disk (`/update_weights_from_disk`), refused at the engine ---

def _disk_update_rank(module: Any, loads: list[str], fault: str | None) -> SimpleNamespace:
    """One TP rank's model-runner weight updater as SGLang's `update_weights_from_disk` uses it, with a loader
    whose weights iterator records the checkpoint it is asked for. `fault`: "missing", this rank cannot open the
    new checkpoint; "transient", its first read of it fails part-way (a shard read error) and the next succeeds."""
    from sglang.srt.model_loader.loader import DefaultModelLoader

    loader = object.__new__(DefaultModelLoader)

    def weights(source: str) -> Any:
        loads.append(source)
        if fault == "missing":
            raise FileNotFoundError(source)
        first = loads.count(source) == 1

        def read() -> Any:
            if fault == "transient" and first:
                raise OSError("shard read error")
            yield from ()

        return read()

    loader._get_weights_iterator = weights
    loader.load_weights_and_postprocess = lambda model, weights, device: list(weights)
    module.get_model_loader = lambda load_config, model_config: loader
    recaptured: list[bool] = []
    return SimpleNamespace(
        device="cuda", gpu_id=0, model_config=SimpleNamespace(model_path="/models/old", dtype=_float32()),
        get_model=lambda: object(), _assert_weight_cache_inactive=lambda op: None,
        update_model_fields=lambda model, **fields: None, recapture_cuda_graph=lambda: recaptured.append(True),
        recaptured=recaptured)


def _float32() -> Any:
    import torch

    return torch.float32


def test_a_disk_weight_load_failing_on_one_rank_skips_the_recapture_its_peers_run(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """SGLang's own `WeightUpdater.update_weights_from_disk` (what each rank runs for the broadcast
    UpdateWeightFromDiskReqInput): a rank that cannot open the new checkpoint answers False at once, and one whose
    read fails part-way "rolls back" by reading the new checkpoint again (`model_config.model_path` is set to it
    before the load) and answers False holding the new weights; either skips the CUDA-graph recapture, whose
    capture forwards enter the model's TP collectives on the ranks that loaded. The scheduler's handler then
    flushes the cache only on the ranks that loaded."""
    requires.installed("sglang")
    from sglang.srt.managers.scheduler_components.weight_updater import SchedulerWeightUpdaterManager
    from sglang.srt.model_executor.model_runner_components import weight_updater as module
    from sglang.srt.model_loader.loader import DefaultModelLoader

    monkeypatch.setattr(module, "get_model", lambda: SimpleNamespace(weight_cache_mode="off"))
    monkeypatch.setattr(module, "_unsupported_derived_weight_cache_error", lambda model: None)
    monkeypatch.setattr(module, "get_available_gpu_memory", lambda *args, **kwargs: 0.0)
    monkeypatch.setattr(module, "get_pp_stage_load_group", lambda: None)
    monkeypatch.setattr(DefaultModelLoader.Source, "init_new",
                        classmethod(lambda cls, config, model: config.model_path))
    monkeypatch.setattr(DefaultModelLoader, "restore_weights_before_loading", staticmethod(lambda model, device: None))
    monkeypatch.setattr(module, "get_model_loader", None)

    answers, recaptures, reads = [], [], []
    for fault in (None, "missing", "transient"):  # the same request on three ranks
        loads: list[str] = []
        rank = _disk_update_rank(module, loads, fault)
        answers.append(module.WeightUpdater.update_weights_from_disk(
            rank, "/models/new", "auto", recapture_cuda_graph=True)[0])
        recaptures.append(rank.recaptured)
        reads.append(loads)
    assert answers == [True, False, False]
    assert recaptures == [[True], [], []], "a rank whose load failed skips the recapture its peer runs"
    assert reads == [["/models/new"], ["/models/new"], ["/models/new", "/models/new"]], \
        "the rollback after a failed read re-reads the new checkpoint, not the old one"
    handler = inspect.getsource(SchedulerWeightUpdaterManager.update_weights_from_disk)
    assert handler.index("if not success:\n                    break") < handler.index(
        "if target_updated:\n                success, message = self.flush_cache_after_weight_update(")


# --- External ngram corpus (`/add_external_corpus`), refused at the engine ---

def test_each_rank_installs_and_commits_an_external_corpus_when_its_own_loader_thread_finishes() -> None:
    """SGLang's own ExternalCorpusManager (NGRAM speculative decoding): `add` (dispatched from the broadcast)
    starts a loader thread on every rank, and `check_pending_load`, every iteration, commits the corpus and answers
    once this rank's thread has finished. The corpus itself is installed by that thread (the loader's last step,
    `finish_external_corpus_load`, moves the built automaton into `sams_`), and the draft lookup splits its token
    budget over `sams_`: from the moment each rank's own thread finishes, its drafts differ from a peer's still
    loading."""
    requires.installed("sglang")
    import threading

    import sglang
    from sglang.srt.managers.io_struct import AddExternalCorpusReqInput
    from sglang.srt.speculative.external_corpus_manager import ExternalCorpusManager

    committed: dict[str, list[str]] = {}
    managers, releases = {}, {}
    for rank in ("fast", "slow"):
        release = threading.Event()  # this rank's loader finishing its work
        worker = SimpleNamespace(
            add_external_corpus=lambda corpus_id, chunks, release=release: release.wait() and 3,
            commit_corpus_load=lambda corpus_id, count, rank=rank: committed.setdefault(rank, []).append(corpus_id))
        managers[rank] = ExternalCorpusManager(worker, send_response=lambda output, req: None)
        releases[rank] = release
        assert managers[rank].add(AddExternalCorpusReqInput(corpus_id="docs", token_chunks=[[1, 2, 3]])) is None
    releases["fast"].set()
    managers["fast"]._pending_load[1].join()  # the fast rank's loader is done before this iteration's check
    for manager in managers.values():  # one iteration, on both ranks
        manager.check_pending_load()
    assert committed == {"fast": ["docs"]}, "one rank commits, its peer's loader is still running"
    releases["slow"].set()
    managers["slow"]._pending_load[1].join()
    managers["slow"].check_pending_load()  # a later iteration
    assert committed == {"fast": ["docs"], "slow": ["docs"]}

    root = pathlib.Path(sglang.__file__).parent / "kernels"
    loader = (root / "ops" / "speculative" / "ngram_corpus.py").read_text()
    body = loader[loader.index("def load_external_corpus_named("):loader.index("def remove_corpus(")]
    assert body.index("self.append_external_corpus_tokens(tokens_t)") < body.index(
        "self.finish_external_corpus_load(corpus_id)")
    native = (root / "jit" / "csrc" / "ngram_corpus" / "ngram.cpp").read_text()
    finish = native[native.index("void Ngram::finishExternalCorpusLoad("):
                    native.index("void Ngram::removeExternalCorpus(")]
    assert "sams_.emplace(corpus_id, std::move(staging_sam_));" in finish
    assert "const size_t num_sams = sams_.size();" in native
