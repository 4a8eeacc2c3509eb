"""The DSML leak guard's pure core (`pdfleet.runtime.toolcalls`): what it calls markup and why, what it
salvages, and that text split into chunks anywhere (inside markers too) comes out as from one piece."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pdfleet.runtime.toolcalls.markup import (
    DSML,
    LONGEST_OPENER,
    Cause,
    Opener,
    contains_markup,
    find_opener,
    held_suffix,
)
from pdfleet.runtime.toolcalls.salvage import Call
from pdfleet.runtime.toolcalls.stream import Action, Context, Step, StreamGuard, scan

TOOLS = frozenset({"get_weather", "ping"})
V32 = "function_calls"
ON = Context(parsing_active=True, expected_block=V32, tools=TOOLS, salvage=True)
OBSERVE = Context(parsing_active=True, expected_block=V32, tools=TOOLS, salvage=False)


def block(name: str, *invokes: str, dsml: bool = True) -> str:
    p = DSML if dsml else ""
    return f"<{p}{name}>\n" + "".join(invokes) + f"</{p}{name}>"


def invoke(tool: str, params: dict[str, tuple[str, str]] | None = None, *, dsml: bool = True) -> str:
    p = DSML if dsml else ""
    body = "".join(f'<{p}parameter name="{k}" string="{s}">{v}</{p}parameter>\n'
                   for k, (s, v) in (params or {}).items())
    return f'<{p}invoke name="{tool}">\n{body}</{p}invoke>\n'


WEATHER = invoke("get_weather", {"city": ("true", " Paris "), "days": ("false", "3")})
BARE_WEATHER = WEATHER.replace(DSML, "")
WEATHER_CALL = Call("get_weather", json.dumps({"city": "Paris", "days": 3}))


# --- detection and causes -----------------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "context", "cause"), [
    (block(V32, BARE_WEATHER, dsml=False), ON, Cause.STRIPPED_MARKERS),
    (invoke("ping", dsml=False), ON, Cause.STRIPPED_MARKERS),  # a bare invoke, as V3.2's parser accepts one
    (block("tool_calls", WEATHER), ON, Cause.WRONG_VERSION),
    (block(V32, WEATHER), ON, Cause.MALFORMED_CALL),  # the right markup in content: the parser refused it
    (block(V32, BARE_WEATHER, dsml=False), Context(parsing_active=False, tools=TOOLS), Cause.PARSER_OFF),
    (block("tool_calls", WEATHER), Context(parsing_active=True, expected_block="tool_calls"), Cause.MALFORMED_CALL),
])
def test_each_leak_is_counted_once_with_the_cause_the_text_and_request_show(
        text: str, context: Context, cause: Cause) -> None:
    step = scan(f"Before. {text} After.", context)
    assert [leak.cause for leak in step.leaks] == [cause]


@pytest.mark.parametrize("text", [
    "", "plain text", "a < b and c > d", "<div>html</div>", "<invoke> without a name", "<tool_calls", "<",
    'an <invoke name=x> without quotes', "｜ full-width bars ｜ alone", "<tool_call>singular</tool_call>",
])
def test_text_without_markup_passes_unchanged_and_uncounted(text: str) -> None:
    for context in (ON, OBSERVE):
        step = scan(text, context)
        assert (step.text, step.calls, step.leaks) == (text, [], [])


def test_salvage_off_reports_and_leaves_content_as_it_was() -> None:
    text = "Checking.\n\n" + block(V32, BARE_WEATHER, dsml=False) + "\nDone."
    step = scan(text, OBSERVE)
    assert step.text == text and step.calls == []
    assert [(leak.cause, leak.action) for leak in step.leaks] == [(Cause.STRIPPED_MARKERS, Action.REPORTED)]


def test_salvage_turns_well_formed_calls_into_calls_and_keeps_every_other_character() -> None:
    text = "Checking.\n\n" + block(V32, BARE_WEATHER, invoke("ping", dsml=False), dsml=False) + "\nDone."
    step = scan(text, ON)
    assert step.calls == [WEATHER_CALL, Call("ping", "{}")]
    assert step.text == "Checking.\n\n\nDone."
    assert [leak.action for leak in step.leaks] == [Action.SALVAGED]


@pytest.mark.parametrize(("region", "why"), [
    (block(V32, invoke("rm_rf", dsml=False), dsml=False), "a tool the request did not declare"),
    (block(V32, invoke("ping", dsml=False) + "stray prose", dsml=False), "text between the tags"),
    (block(V32, invoke("get_weather", {"days": ("false", "three")}, dsml=False), dsml=False), "a non-JSON value"),
    (block(V32, '<invoke name="ping">\n<parameter name="x">1</parameter>\n</invoke>', dsml=False), "no string="),
    (block(V32, '<invoke name="ping"><parameter name="a" string="true">1</parameter>'
                '<parameter name="a" string="true">2</parameter></invoke>', dsml=False), "a repeated parameter"),
    (block(V32, '<invoke name="ping">\n[1, 2]\n</invoke>', dsml=False), "JSON arguments that are no object"),
    (block(V32, '<invoke name="ping">{"x": NaN}</invoke>', dsml=False), "a JSON constant"),
    (block(V32, invoke("ping", dsml=True), dsml=False), "whole and stripped markers mixed"),
    (block(V32, dsml=False), "a block without calls"),
])
def test_a_region_that_is_not_entirely_well_formed_is_withheld_and_no_call_is_invented(region: str, why: str) -> None:
    step = scan(f"A {region} B", ON)
    assert step.calls == [], why
    assert step.text == "A  B", why
    assert [leak.action for leak in step.leaks] == [Action.WITHHELD], why


def test_tool_choice_none_or_no_tools_withholds_markup_but_never_makes_a_call() -> None:
    step = scan(block(V32, BARE_WEATHER, dsml=False), Context(parsing_active=False, salvage=True))
    assert (step.text, step.calls) == ("", [])
    assert [(leak.cause, leak.action) for leak in step.leaks] == [(Cause.PARSER_OFF, Action.WITHHELD)]


def test_a_truncated_region_is_malformed_at_the_end_of_the_stream() -> None:
    guard = StreamGuard(ON)
    first = guard.feed("ok " + block(V32, BARE_WEATHER, dsml=False)[:40])
    assert first.text == "ok " and first.leaks == []
    last = guard.finish()
    assert (last.text, last.calls, [leak.action for leak in last.leaks]) == ("", [], [Action.WITHHELD])
    observed = StreamGuard(OBSERVE)
    held = observed.feed("ok <tool_calls>\n<invoke name=")
    assert held.text == "ok " and observed.finish().text == "<tool_calls>\n<invoke name="


def test_json_arguments_and_self_closing_invokes_are_salvaged() -> None:
    region = block(V32, '<invoke name="get_weather">\n{"city": "Oslo"}\n</invoke>\n<invoke name="ping"/>\n',
                   dsml=False)
    assert scan(region, ON).calls == [Call("get_weather", '{"city": "Oslo"}'), Call("ping", "{}")]


# --- streaming: hold back only what can be a marker ---------------------------------------------------------

@pytest.mark.parametrize(("text", "held"), [
    ("hello", 0), ("hello <", 1), ("x <tool_c", 7), ("x <｜DSML｜inv", 10), ("a <b", 0), ("<invoke name=\"", 14),
    ("x <invoke", 7), ("x < tool", 0),
])
def test_only_a_possible_opener_prefix_is_held(text: str, held: int) -> None:
    assert held_suffix(text) == held
    assert StreamGuard(ON).feed(text).text == text[: len(text) - held]


def test_find_opener_tells_the_form() -> None:
    assert find_opener("x <｜DSML｜tool_calls>") == (2, Opener(dsml=True, block="tool_calls"))
    assert find_opener('<invoke name="a">') == (0, Opener(dsml=False, block=None))
    assert find_opener("<tool_calls") is None
    assert contains_markup("｜DSML｜") and not contains_markup("<tool_call>")


def _chunks(text: str, cuts: list[int]) -> list[str]:
    points = sorted({c % (len(text) + 1) for c in cuts})
    return [text[a:b] for a, b in zip([0, *points], [*points, len(text)], strict=True)]


def _streamed(text: str, cuts: list[int], context: Context) -> Step:
    guard, total = StreamGuard(context), Step()
    for piece in [*_chunks(text, cuts), None]:
        step = guard.finish() if piece is None else guard.feed(piece)
        total.text += step.text
        total.calls.extend(step.calls)
        total.leaks.extend(step.leaks)
    return total


_PIECES = st.sampled_from([
    "Hello", " world", "\n\n", "a < b", "<div>", "｜", "<", "<tool_c", "x" * 50,
    block(V32, BARE_WEATHER, dsml=False), block("tool_calls", invoke("ping")), block(V32, WEATHER),
    invoke("ping", dsml=False), block(V32, invoke("nope"), dsml=False), block(V32, WEATHER)[:-5],
])


@settings(max_examples=300, deadline=None)
@given(pieces=st.lists(_PIECES, max_size=8), cuts=st.lists(st.integers(0, 10_000), max_size=40),
       salvage=st.booleans())
def test_any_chunking_gives_what_the_whole_text_gives(pieces: list[str], cuts: list[int], salvage: bool) -> None:
    text = "".join(pieces)
    context = ON if salvage else OBSERVE
    whole, streamed = scan(text, context), _streamed(text, cuts, context)
    assert streamed == whole
    if salvage:
        assert all(leak.action != Action.REPORTED for leak in streamed.leaks)
        assert len(streamed.calls) <= text.count("invoke name=")
    else:
        assert streamed.text == text, "observe mode never changes content"


@settings(max_examples=200, deadline=None)
@given(text=st.text(alphabet=st.sampled_from(list("ab <>/=\"｜DSMLinvoketool_cals\n")), max_size=80),
       cuts=st.lists(st.integers(0, 200), max_size=20))
def test_random_text_is_never_lost_and_never_duplicated(text: str, cuts: list[int]) -> None:
    streamed = _streamed(text, cuts, OBSERVE)
    assert streamed.text == text
    salvaged = _streamed(text, cuts, ON)
    assert salvaged == scan(text, ON)
    assert len(salvaged.text) <= len(text)


@settings(max_examples=200, deadline=None)
@given(text=st.text(alphabet=st.sampled_from(list("ab <>/=\"｜DSMLinvoketool_cals\n")), max_size=80),
       cuts=st.lists(st.integers(0, 200), max_size=20))
def test_text_outside_markup_is_released_at_once_but_for_a_possible_opener(text: str, cuts: list[int]) -> None:
    guard, released, fed = StreamGuard(OBSERVE), "", ""
    for piece in _chunks(text, cuts):
        fed += piece
        released += guard.feed(piece).text
        if find_opener(fed) is None:
            assert released == fed[: len(fed) - held_suffix(fed)]
            assert len(fed) - len(released) < LONGEST_OPENER
