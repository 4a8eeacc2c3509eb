"""health-check-consensus: its decision as a table, the groups it agrees over, and its install on the installed
SGLang 0.5.23 next to the other desync fixes (tests/unit/test_health_check_reproduction.py shows it preventing
the real hang)."""

from __future__ import annotations

import inspect
from types import SimpleNamespace
from typing import Any

import pytest

from pdfleet.runtime.health import phases
from pdfleet.runtime.instrument import seams
from pdfleet.runtime.patches import base, catalogue, registry, targets
from pdfleet.runtime.patches.impl import abort_consensus, health_check_consensus, kv_poll_lockstep

VERSION = "0.5.23"
HC = health_check_consensus
FIXES = (kv_poll_lockstep.PATCH_ID, abort_consensus.PATCH_ID, HC.PATCH_ID)


@pytest.fixture
def restore_sglang(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every target of the three fixes goes back as it was at teardown (monkeypatch undoes the no-op set)."""
    for dotted in {d for impl in (kv_poll_lockstep, abort_consensus, HC) for d in impl.TARGETS}:
        t = targets.resolve(dotted)
        monkeypatch.setattr(t.owner, t.attr, inspect.getattr_static(t.owner, t.attr))


# --- the decision ---------------------------------------------------------------------------------------------

def _min_over(votes_by_group: dict[str, list[int]]) -> Any:
    """A reduction over named groups, where `votes_by_group` holds the other ranks' votes in each group."""
    calls: list[tuple[str, int]] = []

    def reduce_min(vote: int, group: str) -> int:
        calls.append((group, vote))
        return min([vote, *votes_by_group[group]])

    return reduce_min, calls


@pytest.mark.parametrize(("mine", "peers", "agreed"), [
    (True, [1, 1], True),  # every rank idle: all queue the health check
    (True, [1, 0], False),  # a busy peer: this idle rank drops it too
    (False, [1, 1], False),  # this rank busy: its idle peers drop it too
    (False, [0, 0], False),
])
def test_every_rank_gets_idle_only_when_all_are(mine: bool, peers: list[int], agreed: bool) -> None:
    reduce_min, calls = _min_over({"tp": peers})
    assert HC.agree(mine, ["tp"], reduce_min) is agreed
    assert calls == [("tp", int(mine))], "one reduction per group, this rank's own vote"


def test_with_dp_attention_the_vote_of_the_attention_tp_group_is_carried_into_the_cp_group() -> None:
    reduce_min, calls = _min_over({"attn_tp": [0], "attn_cp": [1]})
    assert HC.agree(True, ["attn_tp", "attn_cp"], reduce_min) is False
    assert calls == [("attn_tp", 1), ("attn_cp", 0)]


def test_without_a_group_to_agree_with_the_local_answer_stands() -> None:
    reduce_min, calls = _min_over({})
    assert HC.agree(False, [], reduce_min) is False and HC.agree(True, [], reduce_min) is True
    assert calls == []


SIZES = {"tp": 4, "attn_tp": 2, "attn_cp": 2, "single": 1}


@pytest.mark.parametrize(("dp_attention", "groups", "expected"), [
    (False, {"tp_cpu_group": "tp"}, ["tp"]),
    (True, {"attn_tp_cpu_group": "attn_tp", "attn_cp_cpu_group": "attn_cp"}, ["attn_tp", "attn_cp"]),
    (True, {"attn_tp_cpu_group": "attn_tp", "attn_cp_cpu_group": "single"}, ["attn_tp"]),
    (True, {"attn_tp_cpu_group": "single", "attn_cp_cpu_group": "single"}, []),
    (False, {"tp_cpu_group": "single"}, []),
])
def test_the_groups_are_those_that_share_the_broadcast_of_the_request(
    dp_attention: bool, groups: dict[str, str], expected: list[str]
) -> None:
    scheduler = SimpleNamespace(tp_cpu_group="tp", attn_tp_cpu_group="attn_tp", attn_cp_cpu_group="attn_cp")
    vars(scheduler).update(groups)
    assert HC.sharing_groups(scheduler, dp_attention=dp_attention, sizes=SIZES.__getitem__) == expected


# --- the patch against the installed SGLang ------------------------------------------------------------------

def test_the_catalogue_the_registry_and_the_fingerprints_name_the_same_targets() -> None:
    assert catalogue.BY_ID[HC.PATCH_ID].targets == HC.TARGETS
    assert set(HC.FINGERPRINTS[VERSION]) == set(HC.TARGETS)
    assert registry.MODULES[HC.PATCH_ID] == HC.__name__
    for dotted, expected in HC.FINGERPRINTS[VERSION].items():
        assert targets.verify(dotted, expected).function is not None
    assert HC.FINGERPRINTS[VERSION][HC.PROCESS_INPUT_REQUESTS] == \
        abort_consensus.FINGERPRINTS[VERSION][abort_consensus.PROCESS_INPUT_REQUESTS]


def test_the_call_site_is_the_health_check_skip_and_its_only_caller() -> None:
    """The agreement relies on `is_fully_idle(for_health_check=True)` being reached from the health-check
    branch only: every rank of the group then enters it at the same request of the same broadcast."""
    from pathlib import Path

    import sglang
    import sglang.srt.managers.scheduler as scheduler_module

    callers = [path for path in Path(sglang.__file__).parent.rglob("*.py")
               if "for_health_check=True" in path.read_text(errors="replace")]
    assert callers == [Path(scheduler_module.__file__)]
    assert inspect.getsource(scheduler_module).count("for_health_check=True") == 1
    branch = inspect.getsource(scheduler_module.Scheduler.process_input_requests)
    assert "if is_health_check_generate_req(recv_req) and not self.is_fully_idle(\n" \
           "                for_health_check=True\n            ):" in branch


def test_all_three_fixes_install_together_each_replacing_only_its_own_functions(restore_sglang: None) -> None:
    applied = base.apply(FIXES, VERSION, registry.implementations(FIXES))
    assert [a.id for a in applied] == list(FIXES)
    assert targets.resolve(HC.IS_FULLY_IDLE).function.__pdfleet_patch__ == HC.PATCH_ID
    # Fingerprinted by both, replaced by abort-consensus alone: its broadcast marker must survive.
    assert targets.resolve(HC.PROCESS_INPUT_REQUESTS).function.__pdfleet_patch__ == abort_consensus.PATCH_ID


class _Writer(seams.UNATTACHED.__class__):  # type: ignore[misc]
    """Notes the collectives a replacement marks."""

    def __init__(self) -> None:
        self.entered: list[phases.Phase] = []

    def collective(self, phase: phases.Phase) -> None:
        self.entered.append(phase)


@pytest.mark.parametrize(("mine", "peer_vote", "dp_attention", "agreed", "groups"), [
    (True, 1, False, True, ["tp"]),
    (True, 0, False, False, ["tp"]),
    (False, 1, False, False, ["tp"]),
    (True, 0, True, False, ["attn_tp", "attn_cp"]),
])
def test_only_the_health_check_call_agrees_and_it_is_marked_in_the_ledger(
    monkeypatch: pytest.MonkeyPatch, mine: bool, peer_vote: int, dp_attention: bool, agreed: bool,
    groups: list[str],
) -> None:
    import sglang.srt.runtime_context as runtime_context
    import torch.distributed as dist

    asked: list[tuple[bool, bool]] = []  # what SGLang's own is_fully_idle was asked: (for_health_check, ignore)
    reduced: list[tuple[str, int]] = []

    def original(self: Any, for_health_check: bool = False, ignore_waiting: bool = False) -> bool:
        asked.append((for_health_check, ignore_waiting))
        return mine

    def reduce_min(vote: int, group: str) -> int:
        reduced.append((group, vote))
        return min(vote, peer_vote)

    monkeypatch.setattr(HC, "gloo_min", reduce_min)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 2)
    monkeypatch.setattr(runtime_context, "get_parallel", lambda: SimpleNamespace(attn_dp_enabled=dp_attention))
    writer = _Writer()
    monkeypatch.setattr(seams, "_writer", writer)
    patched = HC.replacements({HC.IS_FULLY_IDLE: original})[HC.IS_FULLY_IDLE]
    scheduler = SimpleNamespace(tp_cpu_group="tp", attn_tp_cpu_group="attn_tp", attn_cp_cpu_group="attn_cp")

    assert patched(scheduler) is mine and patched(scheduler, ignore_waiting=True) is mine
    assert reduced == [] and writer.entered == [], "on_idle and the other callers: no collective"
    assert patched(scheduler, for_health_check=True) is agreed
    assert asked == [(False, False), (False, True), (True, False)]
    assert [group for group, _ in reduced] == groups and reduced[0][1] == int(mine)
    assert writer.entered == [phases.Phase.HEALTH_CHECK_AGREEMENT]
    sglang_params = inspect.signature(targets.resolve(HC.IS_FULLY_IDLE).function).parameters.values()
    own_params = inspect.signature(patched, follow_wrapped=False).parameters.values()
    assert [(p.name, p.default) for p in own_params] == [(p.name, p.default) for p in sglang_params]
