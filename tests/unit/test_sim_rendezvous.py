"""The engine simulator's collectives across the pods of a multi-node group: the leader's meeting (pure), the
pod's view of cluster DNS, the wire (a real server and links on 127.0.0.1), and real rank processes of two
"pods" (each its own ledger and barriers) whose ledgers, read as the agents read them, are judged by the
runtime's own `verdict.judge`: a desync on pod 1 holds pod 0's ranks too and reads as Desync; without a fault
both pods' ranks make progress together."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pdfleet.runtime.health import ledger, phases, procs, report, verdict
from pdfleet.runtime.simulator import dns
from pdfleet.runtime.simulator.config import Engine, Timing
from pdfleet.runtime.simulator.faults import Asked, Fault
from pdfleet.runtime.simulator.meeting import Hello, Meeting
from pdfleet.runtime.simulator.ranks import Control, RankGroup
from pdfleet.runtime.simulator.rendezvous import Crossing, Link, Server, split_addr
from tests.support.operator_process import free_port

POLICY = verdict.HealthPolicy.from_seconds(desync_after=0.5, hang_after=0.5)
LEADER = "g-decode-0-0.g-decode.ns.svc"
S = 1e9


# -------------------------------------------------------------------------------------------- meeting


def hello(rank: int, *, group: str = "g", nnodes: int = 2, world: int = 4, uid: str | None = "u0") -> Hello:
    return Hello(group, nnodes, world, rank // (world // nnodes), rank, uid)


def test_a_hello_of_another_group_shape_or_leader_or_a_rank_twice_is_refused() -> None:
    m = Meeting(group="g", nnodes=2, world=4, leader_uid="u0")
    assert "not 'h'" in (m.join(hello(2, group="h")) or "")
    assert "2 node(s) and 4 rank(s), not 2 and 8" in (m.join(hello(2, world=8)) or "")
    # A follower of a restarted group (same names) that reached the previous leader's process.
    assert "leader here is pod u0, not u1" in (m.join(hello(2, uid="u1")) or "")
    assert "not on node rank 0" in (m.join(Hello("g", 2, 4, 0, 3, None)) or "")
    assert m.join(hello(2)) is None and m.join(hello(2, uid=None)) == "rank 2 already joined group 'g'"
    assert not m.formed
    for rank in (0, 1, 3):
        assert m.join(hello(rank)) is None
    assert m.formed


def test_a_collective_completes_once_every_pod_entered_the_same_one() -> None:
    m = Meeting(group="g", nnodes=2, world=4, leader_uid=None)
    m.arrive(0, 1, "recv_broadcast")
    assert not m.released(1) and m.waiting() == {1: {0: "recv_broadcast"}}
    m.arrive(1, 1, "recv_broadcast")
    assert m.released(1) and m.waiting() == {}
    # Pods that reached collective 2 in different collectives diverged: it never completes.
    m.arrive(1, 2, "recv_broadcast")
    m.arrive(0, 2, "kv_poll_all_reduce")
    assert not m.released(2) and m.waiting() == {2: {1: "recv_broadcast", 0: "kv_poll_all_reduce"}}


def test_a_hello_reads_back_what_it_said_and_garbage_is_no_hello() -> None:
    h = hello(3, uid=None)
    assert Hello.from_json(h.to_json()) == h
    with pytest.raises(ValueError, match="not a hello"):
        Hello.from_json({"group": "g"})


# ------------------------------------------------------------------------------------------------ names


def test_the_hosts_view_resolves_pod_names_to_loopback_addresses_only(tmp_path: Path) -> None:
    hosts = tmp_path / "hosts"
    hosts.write_text(f"# pdfleet-sim\n127.1.0.7 {LEADER} {LEADER}.cluster.local # uid=u0\n"
                     "10.0.0.9 outside.svc.ns.svc\n")
    assert dns.resolve(LEADER, hosts) == dns.Address("127.1.0.7", "u0")
    assert dns.resolve(f"{LEADER}.cluster.local.", hosts) == dns.Address("127.1.0.7", "u0")
    assert dns.resolve("outside.svc.ns.svc", hosts) is None, "never anything but loopback"
    assert dns.resolve("not-yet.svc.ns.svc", hosts) is None
    assert dns.resolve("127.0.0.1", hosts) == dns.Address("127.0.0.1")
    assert dns.resolve("10.1.2.3", hosts) is None
    assert dns.resolve(LEADER, tmp_path / "missing") is None
    assert split_addr(f"{LEADER}:5000") == (LEADER, 5000) and split_addr("[::1]:5000") == ("::1", 5000)
    with pytest.raises(ValueError, match="is not host:port"):
        split_addr(LEADER)


def test_a_single_pod_engine_crosses_nothing() -> None:
    assert Crossing.of(nnodes=1, node_rank=0, world=2, dist_init_addr=None, bind="127.0.0.1", env={}) is None
    leader = Crossing.of(nnodes=2, node_rank=0, world=4, dist_init_addr=f"{LEADER}:5000", bind="0.0.0.0",
                         env={"PDFLEET_GROUP": "g", "PDFLEET_POD_UID": "u0"})
    assert leader is not None and (leader.leader_host, leader.port, leader.group, leader.own_uid) == \
        ("127.0.0.1", 5000, "g", "u0"), "the leader listens on loopback, whatever it was told"


# ------------------------------------------------------------------------------------------------- wire


def crossing(node_rank: int, port: int, *, group: str = "g", world: int = 2, hosts: Path | None = None,
             uid: str | None = None) -> Crossing:
    host = "127.0.0.1" if node_rank == 0 else LEADER
    return Crossing(group, 2, world, node_rank, host, port, hosts, uid)


def test_links_join_their_leader_and_meet_only_in_the_same_collective(tmp_path: Path) -> None:
    port = free_port()
    hosts = tmp_path / "hosts"
    hosts.write_text(f"127.0.0.1 {LEADER} # uid=u0\n")
    server = Server(crossing(0, port, uid="u0")).start()
    stop = threading.Event()
    try:
        # Another group's follower, and a follower that sees another leader pod: refused, they keep trying.
        strays = [Link(crossing(1, port, group="other", hosts=hosts), rank=1, stopped=stop.is_set),
                  Link(crossing(1, port, hosts=tmp_path / "stale"), rank=1, stopped=stop.is_set)]
        (tmp_path / "stale").write_text(f"127.0.0.1 {LEADER} # uid=u-old\n")
        with contextlib.ExitStack() as threads:
            pool = [threading.Thread(target=s.join, daemon=True) for s in strays]
            for t in pool:
                t.start()
            time.sleep(0.6)
            assert server.meeting.joined == set()
            leader = Link(crossing(0, port, uid="u0"), rank=0, stopped=stop.is_set)
            follower = Link(crossing(1, port, hosts=hosts), rank=1, stopped=stop.is_set)
            joined: dict[int, bool] = {}
            both = [threading.Thread(target=lambda link=link: joined.__setitem__(link.rank, link.join()))
                    for link in (leader, follower)]
            for t in both:
                t.start()
            for t in both:
                t.join(10)
            assert joined == {0: True, 1: True} and server.meeting.formed
            threads.callback(stop.set)

            met: list[int] = []
            first = threading.Thread(target=lambda: (leader.meet(1, "recv_broadcast"), met.append(0)))
            first.start()
            time.sleep(0.3)
            assert met == [], "one pod in a collective waits for the other"
            follower.meet(1, "recv_broadcast")
            first.join(5)
            assert met == [0]

            broken: list[str] = []

            def diverge(link: Link, kind: str) -> None:
                try:
                    link.meet(2, kind)
                except threading.BrokenBarrierError:
                    broken.append(kind)
            pair = [threading.Thread(target=diverge, args=(leader, "kv_poll_all_reduce")),
                    threading.Thread(target=diverge, args=(follower, "recv_broadcast"))]
            for t in pair:
                t.start()
            time.sleep(0.5)
            assert broken == [], "different collectives never complete"
            stop.set()
            for t in (*pair, *pool):
                t.join(5)
            assert sorted(broken) == ["kv_poll_all_reduce", "recv_broadcast"], "a stop breaks them"
    finally:
        stop.set()
        server.close()


# ------------------------------------------------------------------------------------------ rank processes


@contextlib.contextmanager
def two_pods(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, per_pod: int,
             mode: str = "decode") -> Iterator[tuple[list[Control], list[Path]]]:
    """A group of two pods of `per_pod` rank processes each, the leader's server on a free 127.0.0.1 port, the
    follower finding it by name through a hosts view, as on the local fleet."""
    port = free_port()
    world = 2 * per_pod
    addr = f"{LEADER}:{port}"
    (tmp_path / "pod1").mkdir()
    (tmp_path / "pod1" / "hosts").write_text(f"127.0.0.1 {LEADER} # uid=u0\n")
    envs = [{"PDFLEET_GROUP": "g-decode-0", "PDFLEET_POD_UID": "u0"},
            {"PDFLEET_GROUP": "g-decode-0", "PDFLEET_POD_UID": "u1", "PDFLEET_PODINFO": str(tmp_path / "pod1")}]
    controls, groups, ledgers = [], [], []
    for node_rank, env in enumerate(envs):
        engine = Engine(mode, True, 1, world, 2, node_rank, "127.0.0.1", 0, 0, "m", "m", "fake", addr)
        found = Crossing.of(nnodes=2, node_rank=node_rank, world=world, dist_init_addr=addr, bind="127.0.0.1",
                            env=env)
        control = Control(engine.local_ranks, found)
        path = tmp_path / f"ledger{node_rank}"
        monkeypatch.setenv("PDFLEET_LEDGER_PATH", str(path))  # read by the ranks as they attach, after the fork
        groups.append(RankGroup(engine, Timing(), control).start())
        controls.append(control)
        ledgers.append(path)
    leader = controls[0].crossing
    assert leader is not None
    server = Server(leader).start()  # after the forks, as the engine starts it
    try:
        yield controls, ledgers
    finally:
        for group in groups:
            group.control.release_all()
        for group in groups:
            group.stop()
        server.close()


def read(ledgers: list[Path]) -> list[report.PodReport]:
    out = []
    for path in ledgers:
        with ledger.Ledger.open_readonly(path) as led:
            out.append(report.build(led.read_all(), now_ns=time.monotonic_ns(), ledger=str(path),
                                    alive=lambda r: procs.is_alive(r.pid, r.pid_start)))
    return out


def judged(ledgers: list[Path], world: int) -> verdict.Verdict:
    return verdict.judge(report.rank_views(read(ledgers), expected=range(world)), POLICY)


def wait_until(what: str, cond: object, timeout: float = 20.0) -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if got := cond():  # type: ignore[operator]
                return got
        except (FileNotFoundError, ledger.LedgerError):
            pass  # a ledger its ranks have not created yet
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def iterations(ledgers: list[Path]) -> dict[int, int]:
    return {e.record.rank: e.record.iteration for r in read(ledgers) for e in r.ranks}


def test_without_a_fault_both_pods_ranks_make_progress_together(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    with two_pods(tmp_path, monkeypatch, per_pod=2) as (_, ledgers):
        wait_until("every rank in the loop", lambda: judged(ledgers, 4).health is verdict.Health.HEALTHY)
        before, t0 = iterations(ledgers), time.monotonic()
        time.sleep(2.0)
        after, took = iterations(ledgers), time.monotonic() - t0
        rates = {rank: (after[rank] - before[rank]) / took for rank in after}
        print(f"iterations a second, 2 pods x 2 ranks, idle (30 ms a step): {rates}")
        assert min(rates.values()) > 5, rates
        assert max(after.values()) - min(after.values()) <= 1, f"in lockstep across the pods: {after}"
        assert judged(ledgers, 4).health is verdict.Health.HEALTHY


def test_a_desync_on_pod_1_holds_pod_0s_ranks_and_reads_as_desync(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    with two_pods(tmp_path, monkeypatch, per_pod=2) as (controls, ledgers):
        wait_until("every rank in the loop", lambda: judged(ledgers, 4).health is verdict.Health.HEALTHY)
        controls[1].ask(Asked(Fault.DESYNC))
        found = wait_until("a Desync verdict", lambda: (v := judged(ledgers, 4)).health is verdict.Health.DESYNC
                           and v)
        assert isinstance(found, verdict.Verdict)
        time.sleep(1.0)
        views = {v.rank: v for v in report.rank_views(read(ledgers), expected=range(4))}
        # Pod 0 (ranks 0, 1) waits in the decode KV poll, held by pod 1, whose rank 3 skipped it.
        assert {r: views[r].phase for r in views} == {0: phases.Phase.DECODE_TRANSFER_POLL,
                                                      1: phases.Phase.DECODE_TRANSFER_POLL,
                                                      2: phases.Phase.DECODE_TRANSFER_POLL,
                                                      3: phases.Phase.RECV_BROADCAST}
        assert min(views[r].phase_age_ns for r in (0, 1)) > 1 * S, "pod 0's ranks are blocked too"
        assert judged(ledgers, 4).health is verdict.Health.DESYNC


def test_one_rank_a_pod_desyncs_across_pods(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With one rank per pod, pod 1's own barrier completes at once, but it reaches the next collective in another
    kind than pod 0: the pods never meet, as the e2e's two 1-GPU pods."""
    with two_pods(tmp_path, monkeypatch, per_pod=1) as (controls, ledgers):
        wait_until("every rank in the loop", lambda: judged(ledgers, 2).health is verdict.Health.HEALTHY)
        controls[1].ask(Asked(Fault.DESYNC))
        wait_until("a Desync verdict", lambda: judged(ledgers, 2).health is verdict.Health.DESYNC)


def test_a_dead_rank_on_pod_1_leaves_pod_0_blocked_and_reads_as_dead(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    with two_pods(tmp_path, monkeypatch, per_pod=2) as (controls, ledgers):
        wait_until("every rank in the loop", lambda: judged(ledgers, 4).health is verdict.Health.HEALTHY)
        controls[1].ask(Asked(Fault.DEAD_RANK))
        wait_until("a Dead verdict", lambda: judged(ledgers, 4).health is verdict.Health.DEAD)
        time.sleep(1.0)
        pod0 = verdict.judge(report.rank_views(read(ledgers[:1]), expected=range(2)), POLICY)
        assert pod0.health is verdict.Health.HANG, f"pod 0 alone reads as blocked: {pod0.reason}"
