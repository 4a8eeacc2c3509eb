"""docs/desync-audit.md names every collective the scan finds reachable from a PD scheduler loop, and every door.

The scan (tests/support/desync_scan/) reads the installed SGLang once per process; the test of the test scans
a copy of the modules it read, with one collective added behind a dispatched handler, in another module.
"""

from __future__ import annotations

import ast
import shutil
from pathlib import Path

import pytest
import sglang

from tests.support.desync_scan import holders, page, primitives, scan
from tests.support.desync_scan.graph import Graph, Node
from tests.support.desync_scan.index import Function, Index

AUDIT_PAGE = Path(__file__).resolve().parents[2] / "docs" / "desync-audit.md"
SGLANG_ROOT = Path(sglang.__file__).parent


def test_every_reachable_collective_and_each_entry_to_it_has_a_row() -> None:
    problems = page.problems(scan.installed(), AUDIT_PAGE.read_text())
    assert problems == [], ("re-audit in docs/desync-audit.md (`python -m tests.support.desync_scan.scan` prints "
                            "each chain and its conditions):\n" + "\n".join(problems))


def test_every_door_the_scan_maps_to_a_handler_has_a_row() -> None:
    problems = page.door_problems(scan.installed(), AUDIT_PAGE.read_text())
    assert problems == [], "add the doors to docs/desync-audit.md:\n" + "\n".join(problems)


def test_the_scan_lists_the_sampler_the_grammar_paths_the_weight_group_routes_and_the_grpc_server() -> None:
    """Issue 39's acceptance: what an independent read found that the scan used to miss, found by the scan."""
    found = scan.installed()
    weights = "sglang.srt.model_executor.model_runner_components"
    collectives = {
        "sglang.srt.layers.sampler.Sampler._sync_token_ids_across_tp:torch.distributed.all_reduce":
            "Scheduler.run_batch",
        "sglang.srt.constrained.grammar_manager.GrammarManager.get_ready_grammar_requests:"
        "torch.distributed.all_gather_object": "SchedulerDisaggregationDecodeMixin.get_next_disagg_decode_batch_to_run",
        f"{weights}.weight_updater.WeightUpdater.init_weights_update_group:sglang.srt.utils.common."
        "init_custom_process_group": "SchedulerWeightUpdaterManager.init_weights_update_group",
        f"{weights}.weight_exporter.WeightExporter.init_weights_send_group_for_remote_instance:"
        "torch.distributed.barrier": "Scheduler.init_weights_send_group_for_remote_instance",
        f"{weights}.weight_exporter.WeightExporter.send_weights_to_remote_instance:torch.distributed.broadcast":
            "Scheduler.send_weights_to_remote_instance",
    }
    assert {key: entry for key, entry in collectives.items()
            if key not in found.collectives or entry not in {scan.short(e) for e in found.collectives[key].entries}
            } == {}
    grammar_failures = {
        "sglang.srt.managers.scheduler_components.batch_result_processor.SchedulerBatchResultProcessor."
        "_apply_prefill_grammar",
        "sglang.srt.disaggregation.decode_schedule_batch_mixin.ScheduleBatchDisaggregationDecodeMixin.process_prebuilt",
        "sglang.srt.disaggregation.prefill.SchedulerDisaggregationPrefillMixin.process_batch_result_disagg_prefill",
    }
    assert grammar_failures - found.reached == set()
    doors = {door: {scan.short(h) for h in handlers} for door, handlers in found.doors.items()}
    assert doors["gRPC RuntimeHandle.update_weights_from_disk"] == {
        "SchedulerWeightUpdaterManager.update_weights_from_disk"}
    assert doors["POST /init_weights_update_group"] == {"SchedulerWeightUpdaterManager.init_weights_update_group"}
    assert doors["GET,POST /release_memory_occupation"] == {"SchedulerWeightUpdaterManager.release_memory_occupation"}


# (entry function, a collective only the resolution kind reaches from it)
_KIND_FINDS = {
    "holders": (  # a field typed Any filled by the constructor, then the worker's `model_runner` property
        "sglang.srt.managers.scheduler_components.weight_updater.SchedulerWeightUpdaterManager.init_weights_update_group",
        "sglang.srt.model_executor.model_runner_components.weight_updater.WeightUpdater.init_weights_update_group:"
        "sglang.srt.utils.common.init_custom_process_group"),
    "accessors": (  # `get_parallel().tp_group`, answered by ParallelContext.__getattr__
        "sglang.srt.layers.dp_attention._dp_gather_via_all_gatherv",
        "sglang.srt.layers.dp_attention._dp_gather_via_all_gatherv:GroupCoordinator.all_gatherv"),
    "model": (  # `runner.model_runner.model.get_input_embeddings()`: a model method, any registered model
        "sglang.srt.layers.cp.bcg.bcg.PrefillCPBCGInput.prepare",
        "sglang.srt.layers.dp_attention.attn_tp_all_reduce:GroupCoordinator.all_reduce"),
}


@pytest.mark.parametrize("kind", sorted(_KIND_FINDS))
def test_each_resolution_kind_finds_a_collective_the_scan_misses_without_it(kind: str) -> None:
    start, key = _KIND_FINDS[kind]

    def keys(kinds: frozenset[str]) -> set[str]:
        index = Index(SGLANG_ROOT)
        function = index.resolve(start)
        assert isinstance(function, Function), start
        return scan.collectives_from(Graph(index, kinds), Node(function, function.owner))

    assert key in keys(holders.KINDS)
    assert key not in keys(holders.KINDS - {kind})


def test_the_scan_reaches_the_handlers_and_the_collectives_the_hand_audit_missed() -> None:
    """What issue 24 found by widening the scan, and that the old one could not see, is reached here."""
    found = scan.installed().collectives
    expected = {
        "sglang.srt.managers.scheduler.Scheduler._process_and_broadcast_mm_inputs:"
        "torch.distributed.broadcast_object_list": "Scheduler.handle_generate_request",
        "sglang.srt.mem_cache.unified_radix_cache.UnifiedRadixCache._all_reduce_attn_groups:"
        "torch.distributed.all_reduce": "SchedulerDisaggregationDecodeMixin.process_decode_queue",
        "sglang.srt.utils.common.get_available_gpu_memory:torch.distributed.all_reduce":
            "Scheduler.handle_pd_role_switch",
        "sglang.srt.managers.scheduler_components.profiler_manager.SchedulerProfilerManager._start_profile:"
        "torch.distributed.barrier": "Scheduler.run_batch",
    }
    assert {key: entry for key, entry in expected.items()
            if entry not in {scan.short(e) for e in found[key].entries}} == {}


def test_the_group_coordinator_primitives_are_the_methods_that_reach_torch_distributed() -> None:
    """`primitives.GROUP_COORDINATOR` is read off the source: each public method of SGLang's GroupCoordinator
    that calls a torch.distributed primitive, itself or through its private helpers, is on the list."""
    tree = ast.parse((SGLANG_ROOT / "srt/distributed/parallel_state.py").read_text())
    coordinator = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "GroupCoordinator")
    methods = {n.name: n for n in coordinator.body if isinstance(n, ast.FunctionDef)}

    def reaches_torch(name: str, seen: set[str]) -> bool:
        seen.add(name)
        for call in (n for n in ast.walk(methods[name]) if isinstance(n, ast.Call)):
            text = ast.unparse(call.func)
            if primitives.torch_primitive(text) is not None:
                return True
            callee = text.removeprefix("self.")
            if text.startswith("self.") and callee in methods and callee not in seen and reaches_torch(callee, seen):
                return True
        return False

    public = {name for name in methods if not name.startswith("_") and reaches_torch(name, set())}
    assert public - primitives.GROUP_COORDINATOR == set()
    assert {"all_reduce", "broadcast_object", "broadcast_object_list", "recv_object", "barrier"} <= public


def _copy_read_modules(found: scan.Scan, into: Path) -> Path:
    root = into / "sglang"
    for path in found.files:
        target = root / path.relative_to(SGLANG_ROOT)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)
    return root


def test_a_collective_added_behind_a_dispatched_handler_in_a_copy_of_sglang_fails_the_check(tmp_path: Path) -> None:
    installed = scan.installed()
    root = _copy_read_modules(installed, tmp_path)
    (root / "srt/utils/desync_probe.py").write_text(
        "import torch.distributed as dist\n\n\n"
        "def gather_names(recv_req):\n"
        "    dist.all_gather_object([None], recv_req.name)\n")
    updater = root / "srt/managers/scheduler_components/weight_updater.py"
    source = updater.read_text()
    handler = "    def get_weights_by_name(self, recv_req: GetWeightsByNameReqInput):\n"
    assert source.count(handler) == 1
    updater.write_text(source.replace(handler, handler + (
        "        if recv_req.name.startswith('probe'):\n"
        "            from sglang.srt.utils.desync_probe import gather_names\n"
        "            gather_names(recv_req)\n")))

    edited = scan.scan(root)

    key = "sglang.srt.utils.desync_probe.gather_names:torch.distributed.all_gather_object"
    assert set(edited.collectives) - set(installed.collectives) == {key}
    added = edited.collectives[key]
    assert {scan.short(e) for e in added.entries} == {"SchedulerWeightUpdaterManager.get_weights_by_name"}
    chain = [scan.short(step.function) for step in added.chain]
    assert chain[0] in {scan.short(r) for r in scan.ROOTS}
    assert chain[-3:] == ["Scheduler.process_input_requests", "SchedulerWeightUpdaterManager.get_weights_by_name",
                          "desync_probe.gather_names"]
    assert "if recv_req.name.startswith('probe')" in added.chain[-2].conditions
    problems = page.problems(edited, AUDIT_PAGE.read_text())
    assert len(problems) == 1 and problems[0].startswith(
        f"no row for {key}, reached from ['SchedulerWeightUpdaterManager.get_weights_by_name']")


def test_a_row_the_scan_no_longer_finds_and_a_missing_entry_are_reported() -> None:
    found = scan.installed()
    text = AUDIT_PAGE.read_text()
    key = "sglang.srt.managers.scheduler.Scheduler.handle_rpc_request:torch.distributed.barrier"
    row = next(line for line in text.splitlines() if line.startswith(f"| `{key}`"))
    renamed = text.replace(row, row.replace("handle_rpc_request:", "handle_rpc_request_gone:").replace(
        "`Scheduler.handle_rpc_request`", "`Scheduler.handle_rpc_request`, `Scheduler.elsewhere`"))
    assert page.problems(found, renamed) == [
        f"no row for {key}, reached from ['Scheduler.handle_rpc_request'] (e.g. "
        + " -> ".join(scan.short(s.function) for s in found.collectives[key].chain) + ")",
        "row sglang.srt.managers.scheduler.Scheduler.handle_rpc_request_gone:torch.distributed.barrier: "
        "the scan no longer reaches it"]
