"""Issue 25's load ramp on the local fleet: both roles autoscaled on their own signals (prefill on its time to
first token, decode on its running requests), a ratio band, and an open-loop ramp from `pdfleet-sim load --ramp`
through the real router. What a user judges: both roles grow within their bounds and shrink back after the ramp,
the spec is inside the band in every version the watch shows, no client request fails (the scale-downs
included), and each role's own scales are as far apart as its stabilisation allows. Its own operator, scoped to
the test's namespace (test_autoscale_e2e's fixture)."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path

import pytest

from pdfleet.podrunner import loadgen
from tests.integration.test_autoscale_e2e import loads, own_operator  # noqa: F401 (a fixture)
from tests.support import fleet, scale_events, watches
from tests.support.cluster import Cluster, wait_for
from tests.support.operator_process import OperatorProcess
from tests.support.pools import example

pytestmark = pytest.mark.cluster

POOL = "ramped"
# The pool is examples/local-autoscaling.yaml as it is (its simulator capacity, bounds, targets, windows and
# band), so the example the demo applies is the one checked here.
SPEC = example("local-autoscaling")["spec"]
MODEL = SPEC["model"]["servedName"]
RAMP = ("3:20:3", 140, 7)  # START:PEAK:END req/s, seconds, seconds a step: 21 steps of 6.7 s
BEHAVIOR = SPEC["autoscaling"]["decode"]["behavior"]
assert SPEC["autoscaling"]["prefill"]["behavior"] == BEHAVIOR
DOWN_WINDOW = BEHAVIOR["scaleDown"]["stabilizationWindowSeconds"]
INTERVAL = BEHAVIOR["minIntervalSeconds"]
BOUNDS = {role: (a["minReplicas"], a["maxReplicas"]) for role, a in SPEC["autoscaling"].items()}
RATIO = SPEC["scaling"]["ratio"]
BAND = (Fraction(RATIO["minDecodePerPrefill"]), Fraction(RATIO["maxDecodePerPrefill"]))  # decode per prefill
OWN_RULES = {"prefill": "TimeToFirstToken", "decode": "RunningPerEngine"}


class PoolWatch(watches.Watch):
    """Every version of the pool the apiserver's watch shows: spec and ready counts of both roles, with the time it
    was seen."""

    FIELDS = ("{.spec.prefill.replicas} {.spec.decode.replicas} {.status.prefill.ready} {.status.decode.ready}"
              "{\"\\n\"}")

    def __init__(self, cluster: Cluster, namespace: str, name: str) -> None:
        super().__init__(cluster, "pdpool", name, "-n", namespace, output=f"jsonpath={self.FIELDS}")

    @property
    def versions(self) -> list[tuple[float, int, int, int, int]]:
        out = []
        for seen in list(self.seen):
            values = [int(v) if v else 0 for v in [*seen.line.split(" "), "", "", "", ""][:4]]
            out.append((seen.at, *values))
        return out  # type: ignore[return-value]

    def sizes(self) -> list[tuple[int, int]]:
        """The spec's (prefill, decode) as it changed."""
        out: list[tuple[int, int]] = []
        for _, prefill, decode, _, _ in self.versions:
            if not out or out[-1] != (prefill, decode):
                out.append((prefill, decode))
        return out

    def timeline(self, since: float) -> list[str]:
        out: list[str] = []
        for at, *values in self.versions:
            line = f"spec {values[0]}+{values[1]} ready {values[2]}+{values[3]}"
            if not out or not out[-1].endswith(line):
                out.append(f"{at - since:6.1f}s {line}")
        return out


@contextlib.contextmanager
def watched(cluster: Cluster, namespace: str, name: str) -> Iterator[PoolWatch]:
    watch = PoolWatch(cluster, namespace, name)
    try:
        yield watch
    finally:
        watch.stop()


def ramp(url: str, out: Path) -> subprocess.Popen[str]:
    spec, seconds, step = RAMP
    return subprocess.Popen(
        [sys.executable, "-m", "pdfleet.podrunner", "load", "--url", url, "--model", MODEL, "--ramp", spec,
         "--ramp-seconds", str(seconds), "--step-seconds", str(step), "--timeout", "30", "--json"],
        stdout=out.open("w"), stderr=subprocess.STDOUT, text=True)


@pytest.mark.effect("spec.autoscaling.prefill.targets.timeToFirstTokenMilliseconds")
def test_an_open_loop_ramp_grows_and_shrinks_both_roles_inside_the_band_with_no_failed_request(
        cluster: Cluster, own_operator: OperatorProcess, namespace: str, tmp_path: Path) -> None:  # noqa: F811
    fleet.apply_pool(cluster, namespace, POOL, base="local-autoscaling")
    fleet.wait_ready(cluster, namespace, POOL, timeout=240)
    url = fleet.router_url(cluster, namespace, POOL, workers=2)
    # A light client besides the ramp, kept on until the pool is back at its minimum: the scale-downs after the
    # ramp are served too.
    light = loadgen.Load(url, model=MODEL, concurrency=1, timeout_s=30)
    began = time.monotonic()
    with watched(cluster, namespace, POOL) as watch, loads(light):
        load = ramp(url, tmp_path / "ramp.json")
        try:
            load.wait(timeout=RAMP[1] + 120)
        finally:
            if load.poll() is None:
                load.kill()
        ramp_ended = time.monotonic()
        wait_for("both roles back at 1 group, Ready",
                 lambda: watch.versions[-1:] and watch.versions[-1][1:] == (1, 1, 1, 1), timeout=180, interval=0.5)
        served = light.tally.ok
        wait_for("requests served after the scale-down", lambda: light.tally.ok >= served + 5, timeout=60)
    text = (tmp_path / "ramp.json").read_text()
    pool_events = [line for line in fleet.event_lines(cluster, namespace) if f" {POOL} " in line]
    story = [f"ramp ended at {ramp_ended - began:.0f} s", *watch.timeline(began), *pool_events]
    print("\n".join(story))
    summary = json.loads(text.strip().splitlines()[-1])
    for phase in summary["phases"]:
        print(f"  {phase['rate']:>6}/s  sent {phase['sent']}  ok {phase['ok']}  failed {phase['failed']}  "
              f"p50 {phase['p50_ms']} ms  p99 {phase['p99_ms']} ms")
    assert load.returncode == 0, text[-3000:]
    assert summary["failed"] == 0 and summary["in_flight"] == 0 and summary["ok"] == summary["sent"], summary
    assert light.tally.failed == 0 and light.tally.in_flight == 0, light.tally.summary()

    sizes = watch.sizes()
    outside = [s for s in sizes if not BAND[0] <= Fraction(s[1], s[0]) <= BAND[1]]
    assert not outside, f"the spec outside the band: {outside} in {sizes}"
    for index, role in enumerate(("prefill", "decode")):
        low, high = BOUNDS[role]
        seen = [s[index] for s in sizes]
        assert max(seen) > low and low <= min(seen) and max(seen) <= high, (role, sizes, story)
        scales = scale_events.own_scales(cluster, namespace, POOL, role)
        assert any(r == "ScaledUp" and f"({OWN_RULES[role]})" in m for _, r, m in scales), (role, scales)
        breaches = scale_events.stabilisation_breaches(scales, interval=INTERVAL, down_window=DOWN_WINDOW)
        assert not breaches, (role, breaches)
    # A scale-down under the ramp's own load, not only once it is over: the fleet shrinks while clients send.
    during = [prefill + decode for at, prefill, decode, _, _ in watch.versions if at < ramp_ended]
    assert any(later < max(during[:i]) for i, later in enumerate(during) if i), (sizes, story)
