"""Why a row of docs/desync-audit.md's "Reachable collectives" stays OPEN, shown on SGLang 0.5.23's own code (the
mechanism only: no fix exists yet, so there is no patched run to compare).

- The multimodal `broadcast_object_list` (`Scheduler._process_and_broadcast_mm_inputs`): `_handle_generate_request`
  returns early for a session the rank's `SessionController` no longer holds, and each rank reaps timed-out
  sessions on its own clock (`maybe_reap`'s interval, `Session.is_timed_out`, `last_active_time`). Two ranks that
  opened the same session from the same broadcast, reading their clocks a millisecond apart, disagree about it.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tests.support import requires

OPENED_AT = 100.0  # the first rank's clock when it opened the session; its peer read 1 ms later
TIMEOUT_S = 5.0


def test_two_ranks_reap_the_same_session_at_different_iterations_on_their_own_clocks(
        monkeypatch: pytest.MonkeyPatch) -> None:
    requires.installed("sglang")
    from sglang.srt.managers.io_struct import OpenSessionReqInput
    from sglang.srt.session import session_controller as module

    clock = [OPENED_AT]
    monkeypatch.setattr(module.time, "monotonic", lambda: clock[0])  # this process's clock, set by the test
    ranks = []
    for skew in (0.0, 0.001):  # each rank handles the broadcast OpenSessionReqInput at its own moment
        clock[0] = OPENED_AT + skew
        # The radix cache is told of a session's release (both its calls); none is built here.
        controller = module.SessionController(tree_cache=SimpleNamespace(
            release_radix_session=lambda sid: None, release_session=lambda sid: None))
        controller._last_reap_time = clock[0]
        assert controller.open(OpenSessionReqInput(capacity_of_str_len=64, session_id="s", timeout=TIMEOUT_S)).success
        ranks.append(controller)

    # An iteration after the timeout, as process_input_requests reaps: `now` read by each rank after the same
    # broadcast, here at the same moment, half a millisecond past the first rank's deadline and before its peer's.
    held = []
    clock[0] = OPENED_AT + TIMEOUT_S + 0.0005
    for controller in ranks:
        controller.maybe_reap(clock[0])
        held.append("s" in controller)
    assert held == [False, True], "the first rank reaped the session, its peer still holds it"
