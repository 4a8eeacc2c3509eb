"""The pod runner's part of cluster DNS: a pod's `<hostname>.<subdomain>.<namespace>.svc` names, kept from the pods
it watches and written to each played pod of the namespace as its hosts view, which the engine simulator
resolves `--dist-init-addr` through."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

from pdfleet.podrunner import hosts
from pdfleet.podrunner.node import Node
from pdfleet.podrunner.pod import PodWorker
from pdfleet.podrunner.runner import Runner
from pdfleet.runtime.simulator import dns

LEADER = "p-decode-0-0.p-decode.ns.svc"


def pod(name: str = "p-decode-0-0", *, ns: str = "ns", uid: str = "u0", ip: str | None = "127.1.0.7",
        created: str = "2026-12-06T01:00:00Z", deleting: bool = False, phase: str = "Running",
        subdomain: str | None = "p-decode") -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": ns, "uid": uid, "creationTimestamp": created}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-06T01:05:00Z"
    spec: dict[str, Any] = {"hostname": name, "containers": []}
    if subdomain:
        spec["subdomain"] = subdomain
    status: dict[str, Any] = {"phase": phase}
    if ip:
        status["podIP"] = ip
    return {"metadata": meta, "spec": spec, "status": status}


def test_a_pod_with_hostname_subdomain_and_ip_has_its_cluster_dns_names() -> None:
    found = hosts.entry(pod())
    assert found is not None and found.ip == "127.1.0.7" and found.uid == "u0"
    assert found.names == (LEADER, f"{LEADER}.cluster.local")
    for gone in (pod(ip=None), pod(deleting=True), pod(phase="Failed"), pod(phase="Succeeded"),
                 pod(subdomain=None)):
        assert hosts.entry(gone) is None, gone


def test_the_view_changes_only_when_a_name_or_address_does_and_stays_in_its_namespace(tmp_path: Path) -> None:
    view = hosts.HostsView()
    assert view.note(pod(ip=None)) is False, "no address yet: nothing to say"
    assert view.note(pod()) is True
    assert view.note(pod()) is False, "the same pod again changes nothing"
    assert view.note(pod("q-0", ns="other", uid="u9", subdomain="q")) is True
    assert dns.parse_hosts(view.text("ns")) == {LEADER: dns.Address("127.1.0.7", "u0"),
                                                f"{LEADER}.cluster.local": dns.Address("127.1.0.7", "u0")}
    assert "other" not in view.text("ns") and "q-0.q.other.svc" in view.text("other")
    # A restarted group: the old leader is being deleted, the new one of the same name has another IP and uid.
    assert view.note(pod(deleting=True)) is True
    assert dns.parse_hosts(view.text("ns")) == {}
    assert view.note(pod(uid="u1", ip="127.1.0.9", created="2026-12-06T01:06:00Z")) is True
    (tmp_path / "hosts").write_text(view.text("ns"))
    assert dns.resolve(LEADER, tmp_path / "hosts") == dns.Address("127.1.0.9", "u1")
    assert view.forget(pod(uid="u1")) is True and view.forget(pod(uid="u1")) is False
    assert dns.parse_hosts(view.text("ns")) == {}


def test_of_two_live_pods_with_one_name_the_newer_wins() -> None:
    view = hosts.HostsView()
    view.note(pod(uid="new", ip="127.1.0.9", created="2026-12-06T01:06:00Z"))
    view.note(pod(uid="old", ip="127.1.0.7", created="2026-12-06T01:00:00Z"))
    assert dns.parse_hosts(view.text("ns"))[LEADER] == dns.Address("127.1.0.9", "new")


def test_the_runner_writes_each_played_pod_of_the_namespace_its_view(tmp_path: Path) -> None:
    node = cast(Node, type("FakeNode", (), {"pod_dir": lambda self, ns, n: tmp_path / ns / n})())
    runner = Runner(node)
    workers = {}
    for name, ns in (("p-decode-0-1", "ns"), ("x-0", "other")):
        worker = PodWorker(node, pod(name, ns=ns, uid=f"w-{name}"), lambda ns=ns: runner.hosts.text(ns))
        (worker.dir / "podinfo").mkdir(parents=True)
        worker.prepared = True
        runner.workers[worker.uid] = worker
        workers[ns] = worker
    leader = {**pod(), "spec": {**pod()["spec"], "nodeName": None}}  # not bound here: the name counts all the same
    runner.on_upsert(leader)
    view = workers["ns"].dir / "podinfo" / hosts.HOSTS_FILE
    assert dns.resolve(LEADER, view) == dns.Address("127.1.0.7", "u0")
    assert dns.resolve(LEADER, workers["other"].dir / "podinfo" / hosts.HOSTS_FILE) is None, "its own namespace only"
    runner.on_delete(leader)
    assert dns.resolve(LEADER, view) is None


def test_a_namespace_the_runner_does_not_simulate_keeps_no_names() -> None:
    """The operator benchmark's namespaces (pdfleet.dev/simulate=false) hold hundreds of pods no process runs:
    keeping their names cost O(pods) a pod event. A namespace not looked up yet keeps them, as before."""
    node = cast(Node, type("FakeNode", (), {"pod_dir": lambda self, ns, n: Path("/nonexistent")})())
    runner = Runner(node)
    unbound = {**pod(), "spec": {**pod()["spec"], "nodeName": None}}
    runner.simulate["ns"] = False
    runner.on_upsert(unbound)
    assert dns.parse_hosts(runner.hosts.text("ns")) == {}
    runner.simulate["ns"] = True
    runner.on_upsert(unbound)
    assert dns.parse_hosts(runner.hosts.text("ns"))[LEADER] == dns.Address("127.1.0.7", "u0")
