"""The health-check skip of SGLang 0.5.23's intake desyncs a TP group for real, pdfleet detects it, and
`health-check-consensus` prevents it.

Rank processes on a real gloo group (127.0.0.1; two and three ranks) run SGLang's own intake
(`ingest_requests` -> `broadcast_pyobj` -> `process_input_requests` -> `is_fully_idle`) and decode queue
(`process_decode_queue`: retraction gate, handshake and transfer polls); see tests/repro/health_check.py.
The last rank alone holds a retracted request in iterations 3-5 (its own memory decided so); rank 0 broadcasts
a `/health_generate` request at iteration 4 and another at iteration 8, when every rank is idle.

Unpatched, the last rank calls itself busy and drops the first health check while its idle peers queue it in
their prealloc queue. The retraction gate alone would not hang here (every queue is empty), but now the peers
enter SGLang's handshake poll for the health check and the last rank, with nothing to poll, goes on to the next
broadcast: the group hangs, and pdfleet's verdict is Desync naming the last rank in `recv_broadcast` and its
peers in `prealloc_handshake_poll`. With `health-check-consensus` every rank drops the first health check
(a peer was busy) and queues the second (all idle), in the same iterations, and the group stays Healthy.
`kv-poll-lockstep` alone also keeps the group from hanging, differently: its handshake exchange fails the health
check on the idle ranks that queued it, since the busy rank does not hold it.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from pdfleet.runtime.health import phases
from tests.repro import group
from tests.unit.test_desync_reproduction import (  # the harness's launcher fixture and its verdict checks
    STARTUP_S,
    Launch,
    _assert_desync_is_detected_in_time,
    _assert_every_rank_completes_healthy,
    _in_loop,
    _log,
    labels,
)

Phase = phases.Phase
HC, LOCKSTEP, CONSENSUS = "health-check-consensus", "kv-poll-lockstep", "abort-consensus"
BUSY, IDLE = "HEALTH_CHECK_busy", "HEALTH_CHECK_idle"
DECODE_STEPS = 4


def story(world: int) -> dict[str, Any]:
    return {"arrivals": {}, "local_aborts": {}, "retracted": {world - 1: [3, 6]},
            "health_checks": {4: [BUSY], 8: [IDLE]}, "decode_steps": DECODE_STEPS}


# Every rank: the first health check dropped at intake (SGLang notes its reply IPC), the second queued,
# preallocated and transferred in iteration 8, finished after its decode steps.
AGREED = {"skipped": {BUSY: 4}, "queued": {IDLE: 8}, "failed": {}, "transferred": {IDLE: 8},
          "finished": {IDLE: 8 + DECODE_STEPS - 1}}
SGLANG_POLLS = labels(Phase.RECV_BROADCAST, Phase.HEALTH_CHECK_AGREEMENT, Phase.PREALLOC_HANDSHAKE_POLL,
                      Phase.DECODE_TRANSFER_POLL)
ALL_FIXES = labels(Phase.RECV_BROADCAST, Phase.HEALTH_CHECK_AGREEMENT, Phase.RETRACTION_AGREEMENT,
                   Phase.PREALLOC_HANDSHAKE_EXCHANGE, Phase.DECODE_TRANSFER_EXCHANGE)
Outcome = Phase | dict[int | None, dict[str, Any]]  # where the peers wait, or each rank's events (None: all)
CASES: dict[str, tuple[int, tuple[str, ...], Outcome]] = {
    "world2-unpatched": (2, (), Phase.PREALLOC_HANDSHAKE_POLL),
    "world3-unpatched": (3, (), Phase.PREALLOC_HANDSHAKE_POLL),
    "world2-health-check-consensus": (2, (HC,), {None: {**AGREED, "collectives_entered": SGLANG_POLLS}}),
    "world3-health-check-consensus": (3, (HC,), {None: {**AGREED, "collectives_entered": SGLANG_POLLS}}),
    "world3-all-three-fixes": (3, (LOCKSTEP, CONSENSUS, HC), {None: {**AGREED, "collectives_entered": ALL_FIXES}}),
    # Without the agreement the ranks still disagree: the busy rank skips the first health check, its idle
    # peers queue it and then fail it when the handshake exchange shows that the busy rank lacks it (iteration 6,
    # the first after the retraction, when the agreed gate lets the polls run again).
    "world2-kv-poll-lockstep-only": (2, (LOCKSTEP,), {
        0: {**AGREED, "skipped": {}, "queued": {BUSY: 4, IDLE: 8}, "failed": {BUSY: 6}},
        1: {**AGREED},
    }),
}


@pytest.mark.parametrize(("world", "patches", "outcome"), list(CASES.values()), ids=list(CASES))
def test_a_busy_rank_dropping_a_health_check_its_idle_peers_queue_desyncs_unless_they_agree(
    launch: Launch, world: int, patches: tuple[str, ...], outcome: Outcome
) -> None:
    sc, proc = launch(patches, world, **story(world))
    if not group.wait_for(lambda: _in_loop(sc)() or proc.poll() is not None, timeout_s=STARTUP_S):
        pytest.fail(f"the ranks did not enter their loop in {STARTUP_S} s:\n{_log(sc)}")
    if isinstance(outcome, Phase):
        _assert_desync_is_detected_in_time(sc, proc, outcome, early=world - 1)
        return
    _assert_every_rank_completes_healthy(sc, proc)
    for rank in range(world):
        result = json.loads(sc.result_path(rank).read_text())
        assert result["iterations"] == sc.iterations
        assert result["applied"] == list(patches)
        assert result["is_fully_idle_patched_by"] == (HC if HC in patches else None)
        expected = outcome.get(rank, outcome.get(None, {}))
        assert {key: result[key] for key in expected} == expected, f"rank {rank}"
