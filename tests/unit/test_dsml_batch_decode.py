"""dsml-batch-decode-guard on real SGLang code: a tool request (skip_special_tokens=False) batched behind a plain
one loses its `｜DSML｜` markers in the detokenizer of affected releases (0.5.6.post2, 0.5.7), keeps them with the
patch, and keeps them unpatched in 0.5.23, which the catalogue says needs no patch.

Each release runs in its own subprocess (tests/support/detokenizer_probe.py) through its real
`DetokenizerManager.handle_batch_token_id_out`, with an offline tokenizer; `make test` installs the releases.
"""

from __future__ import annotations

import pathlib
import re
from collections.abc import Iterator
from typing import Any

import pytest

from pdfleet.operator.api import checks
from pdfleet.runtime import engine_setup
from pdfleet.runtime.patches import base, catalogue, registry
from pdfleet.runtime.patches.impl import dsml_batch_decode_guard as guard
from tests.support import sglang_release
from tests.support.detokenizer_probe import DSML
from tests.unit.test_api_rejections import merged, minimal_spec

MAIN = "0.5.23"

# DeepSeek V3.2's tool-call block, token by token as its tokenizer splits the markers off.
CALL = ["<", DSML, "function_calls", ">", "\n", "<", DSML, "invoke", ' name="get_weather"', ">", "\n",
        "<", DSML, "parameter", ' name="city"', ' string="true"', ">", "Paris", "</", DSML, "parameter", ">", "\n",
        "</", DSML, "invoke", ">", "\n", "</", DSML, "function_calls", ">"]
WORDS = ["The", " weather", " in", " Paris", " is", " mild", " today", ",", " with", " a", " light", " breeze",
         " from", " the", " west", " and", " clouds", " later", " in", " the", " afternoon", " and", " rain", "."]
TOOL = {"rid": "tool", "tokens": CALL, "skip_special_tokens": False, "spaces_between_special_tokens": True}
PLAIN = {"rid": "plain", "tokens": [*WORDS, *WORDS], "skip_special_tokens": True,
         "spaces_between_special_tokens": True}
EXPECTED = {"tool": "".join(CALL), "plain": "".join(PLAIN["tokens"])}
CHUNKS = [3, 1, 2, 5]  # tokens per step: markers land at chunk starts, ends and middles

SCENARIOS = {
    "plain-then-tool": {"requests": [PLAIN, TOOL]},
    "tool-then-plain": {"requests": [TOOL, PLAIN]},
    "plain-then-tool, batch decode disabled": {"requests": [PLAIN, TOOL], "disable_batch_decode": True},
    "tool alone": {"requests": [TOOL]},
    "plain alone": {"requests": [PLAIN]},
}
SPEC = {"scenarios": {name: {"chunks": CHUNKS, "disable_batch_decode": False} | s for name, s in SCENARIOS.items()}}
RUNS = [(version, patched) for version in sglang_release.RELEASES for patched in (False, True)] + [(MAIN, False)]


@pytest.fixture(scope="module")
def runs() -> Iterator[dict[tuple[str, bool], dict[str, Any]]]:
    """Every (release, patched) probe, started together: each spends most of its time importing SGLang."""
    for version in sglang_release.RELEASES:
        sglang_release.release_dir(version)
    started = {(v, p): sglang_release.start_probe(None if v == MAIN else v, SPEC | {"patch": p}) for v, p in RUNS}
    try:
        yield {key: sglang_release.result(process) for key, process in started.items()}
    finally:
        for process in started.values():
            if process.poll() is None:
                process.kill()
                process.wait()


def texts(run: dict[str, Any], scenario: str) -> dict[str, str]:
    return run["results"][scenario]["texts"]


@pytest.mark.parametrize(("version", "patched"), RUNS)
def test_each_probe_ran_the_real_code_of_its_release(runs: dict[tuple[str, bool], Any], version: str,
                                                     patched: bool) -> None:
    run = runs[(version, patched)]
    assert run["sglang"] == version
    expected_home = sglang_release.cache_dir() / f"sglang-{version}" if version != MAIN else None
    if expected_home is not None:
        assert pathlib.Path(run["sglang_file"]).is_relative_to(expected_home)
    assert run["applied"] == (["dsml-batch-decode-guard"] if patched else [])


@pytest.mark.parametrize("version", sglang_release.RELEASES)
@pytest.mark.parametrize("scenario", ["plain-then-tool", "plain-then-tool, batch decode disabled"])
def test_unpatched_an_affected_release_strips_the_markers_of_a_tool_request_behind_a_plain_one(
    runs: dict[tuple[str, bool], Any], version: str, scenario: str
) -> None:
    got = texts(runs[(version, False)], scenario)
    if version == "0.5.6.post2" and "disabled" in scenario:
        # Up to 0.5.6.post2 the switch decodes request by request: the workaround works there.
        assert got == EXPECTED
        return
    assert got["plain"] == EXPECTED["plain"]
    assert DSML not in got["tool"], "the leak did not reproduce"
    # What the tool-call parser receives: markup without its markers, which it cannot recognise.
    assert got["tool"] == EXPECTED["tool"].replace(DSML, "")
    assert re.search(r'<invoke name="get_weather">', got["tool"])


@pytest.mark.parametrize("version", sglang_release.RELEASES)
def test_unpatched_an_affected_release_is_right_when_the_tool_request_comes_first_or_alone(
    runs: dict[tuple[str, bool], Any], version: str
) -> None:
    run = runs[(version, False)]
    assert texts(run, "tool alone") == {"tool": EXPECTED["tool"]}
    assert texts(run, "plain alone") == {"plain": EXPECTED["plain"]}
    # Request 0's options win: the tool request's keep the markers, and the plain request has none to lose.
    assert texts(run, "tool-then-plain") == EXPECTED


@pytest.mark.parametrize("version", sglang_release.RELEASES)
@pytest.mark.parametrize("scenario", [s for s in SCENARIOS if "alone" not in s])
def test_patched_every_request_gets_what_it_would_get_alone_step_by_step(
    runs: dict[tuple[str, bool], Any], version: str, scenario: str
) -> None:
    run = runs[(version, True)]
    assert texts(run, scenario) == EXPECTED
    alone = {rid: [step[rid] for step in run["results"][f"{rid} alone"]["steps"]] for rid in EXPECTED}
    mixed = run["results"][scenario]["steps"]
    for rid in EXPECTED:
        assert [step[rid] for step in mixed if rid in step] == alone[rid], "incremental offsets moved"
        assert [step[rid] for step in mixed if rid in step] == [step[rid] for step in runs[(version, False)]
                                                               ["results"][f"{rid} alone"]["steps"]]


def test_sglang_0_5_23_keeps_the_markers_without_the_patch(runs: dict[tuple[str, bool], Any]) -> None:
    run = runs[(MAIN, False)]
    for scenario in SCENARIOS:
        assert texts(run, scenario) == {rid: EXPECTED[rid] for rid in texts(run, scenario)}, scenario


def test_the_catalogue_says_fixed_in_0_5_8_and_refuses_the_patch_on_0_5_23() -> None:
    entry = catalogue.BY_ID[guard.PATCH_ID]
    assert entry.fixed_in == "0.5.8"
    assert guard.PATCH_ID not in catalogue.UNAVAILABLE
    assert entry.targets == guard.TARGETS
    assert registry.MODULES[guard.PATCH_ID] == guard.__name__
    assert set(guard.FINGERPRINTS) == set(sglang_release.RELEASES)
    assert all(v in entry.applies_to for v in ["0.5.0", *sglang_release.RELEASES])
    assert "0.5.8" not in entry.applies_to
    with pytest.raises(base.PatchError, match=r"fixed upstream in SGLang 0\.5\.8; this engine runs 0\.5\.23"):
        base.apply([guard.PATCH_ID], MAIN, registry.implementations([guard.PATCH_ID]))


def test_make_test_installs_the_releases_these_tests_run() -> None:
    makefile = (pathlib.Path(__file__).parents[2] / "Makefile").read_text()
    listed = re.search(r"^SGLANG_RELEASES := (.*)$", makefile, re.M)
    assert listed is not None and tuple(listed.group(1).split()) == sglang_release.RELEASES
    assert re.search(r"^test: .*\bsglang-releases\b", makefile, re.M)


# --- the grouping itself, against a tokenizer that records its calls ---------------------------------------------

class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[list[list[int]], bool, bool]] = []

    def batch_decode(self, sequences: list[list[int]], skip_special_tokens: bool = False,
                     spaces_between_special_tokens: bool = True) -> list[str]:
        self.calls.append((sequences, skip_special_tokens, spaces_between_special_tokens))
        return [f"{ids}:{skip_special_tokens}:{spaces_between_special_tokens}" for ids in sequences]

    def decode(self, ids: list[int], **kwargs: Any) -> str:
        return f"one {ids}"


def test_a_mixed_batch_is_decoded_once_per_distinct_options_in_request_order() -> None:
    recorder = Recorder()
    options = [(True, True), (False, True), (True, True), (False, False), (False, True)]
    view = guard.GroupedDecoder(recorder, options)
    out = view.batch_decode([[0], [1], [2], [3], [4]], skip_special_tokens=True, spaces_between_special_tokens=True)
    assert out == [f"[{i}]:{s}:{sp}" for i, (s, sp) in enumerate(options)]
    assert recorder.calls == [([[0], [2]], True, True), ([[1], [4]], False, True), ([[3]], False, False)]


def test_the_view_leaves_other_calls_to_the_tokenizer() -> None:
    recorder = Recorder()
    view = guard.GroupedDecoder(recorder, [(True, True), (False, True)])
    assert view.decode([7]) == "one [7]"
    assert view.batch_decode([[1]], skip_special_tokens=False) == ["[1]:False:True"]  # not this batch's shape
    assert recorder.calls == [([[1]], False, True)]


# --- admission: the workaround switch where it does not work ------------------------------------------------------

@pytest.mark.effect("spec.engine.tokenizerBatchDecode")
@pytest.mark.parametrize(("version", "refused"), [("0.5.6.post2", False), ("0.5.7", True), ("0.5.7.post1", True),
                                                  ("0.5.8", False), (MAIN, False)])
def test_tokenizer_batch_decode_disabled_is_refused_where_the_switch_leaves_the_leak(version: str,
                                                                                    refused: bool) -> None:
    spec = merged(minimal_spec(), {"engine": {"sglangVersion": version, "tokenizerBatchDecode": "Disabled"}})
    # Releases the runtime does not instrument yet are refused for that too: not what this test is about.
    problems = [p for p in checks.validate({"spec": spec}) if p.path != "spec.engine.sglangVersion"]
    if not refused:
        assert problems == []
        return
    [problem] = problems
    assert problem.path == "spec.engine.tokenizerBatchDecode"
    assert problem.message.startswith(f"Disabled does not work on sglangVersion {version}: ")
    assert "add patch dsml-batch-decode-guard" in problem.message


def test_on_0_5_7_the_patch_with_the_switch_enabled_is_accepted() -> None:
    spec = merged(minimal_spec(), {"engine": {"sglangVersion": "0.5.7", "patches": [guard.PATCH_ID]}})
    assert [p.path for p in checks.validate({"spec": spec})] == ["spec.engine.sglangVersion"]  # not instrumented


def test_an_engine_applies_the_patch_once_the_detokenizer_module_is_imported_not_with_the_scheduler() -> None:
    # The scheduler's import ends while the detokenizer's module is still executing its imports (the probe runs
    # this path on the real releases: `applied` above comes from engine_setup's hook, not a direct apply).
    assert engine_setup.deferred(["kv-poll-lockstep", guard.PATCH_ID]) == {
        "sglang.srt.managers.detokenizer_manager": [guard.PATCH_ID]}
    assert engine_setup.deferred(["kv-poll-lockstep", "abort-consensus"]) == {}
