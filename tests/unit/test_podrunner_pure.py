"""The pod runner's pure parts: probe results, restart backoff, env resolution, the downward-API file format,
what a container runs, and the pod status kubelet would report."""

from __future__ import annotations

from pathlib import Path

import pytest

from pdfleet.podrunner import commands, env, podinfo, probes, status
from pdfleet.podrunner.backoff import RestartBackoff

POD = {"metadata": {"name": "p", "namespace": "ns", "uid": "u-1"},
       "spec": {"nodeName": "pdfleet-gpu-0", "serviceAccountName": "sa"},
       "status": {"podIP": "127.1.0.7"}}


# ------------------------------------------------------------------------------------------------ probes


def spec(kind: probes.Kind, **probe: object) -> probes.ProbeSpec:
    container = {"ports": [{"name": "http", "containerPort": 8000}],
                 f"{kind}Probe": {"httpGet": {"path": "/ok", "port": "http"}, **probe}}
    return probes.parse(container)[kind]


def test_probe_defaults_and_named_port() -> None:
    s = spec(probes.Kind.READINESS)
    assert (s.period_s, s.timeout_s, s.failure_threshold, s.success_threshold) == (10, 1, 3, 1)
    assert s.action == probes.Action("http", 8000, "/ok")


def test_readiness_starts_failed_and_flips_only_past_thresholds() -> None:
    state = probes.ProbeState(spec(probes.Kind.READINESS, successThreshold=2, failureThreshold=2))
    assert state.result is probes.Result.FAILURE
    assert not state.observe(True)
    assert state.observe(True) and state.result is probes.Result.SUCCESS
    assert not state.observe(False)
    assert state.observe(False) and state.result is probes.Result.FAILURE


def test_liveness_starts_successful_and_success_threshold_is_forced_to_one() -> None:
    state = probes.ProbeState(spec(probes.Kind.LIVENESS, successThreshold=5, failureThreshold=1))
    assert state.result is probes.Result.SUCCESS
    assert state.observe(False) and state.result is probes.Result.FAILURE
    assert state.observe(True) and state.result is probes.Result.SUCCESS


def test_startup_starts_unknown() -> None:
    state = probes.ProbeState(spec(probes.Kind.STARTUP))
    assert state.result is probes.Result.UNKNOWN
    assert state.observe(True)
    state.reset()
    assert state.result is probes.Result.UNKNOWN


@pytest.mark.parametrize("probe", [{"exec": {"command": ["true"]}}, {"grpc": {"port": 1}},
                                   {"httpGet": {"port": 1, "scheme": "HTTPS"}}, {"httpGet": {"port": "nope"}}])
def test_probes_the_runner_cannot_run_are_refused(probe: dict) -> None:
    with pytest.raises(probes.UnsupportedProbe):
        probes.parse({"readinessProbe": probe})


def test_http_success_range() -> None:
    assert [probes.http_success(c) for c in (199, 200, 302, 399, 400, 503)] == [False, True, True, True, False,
                                                                                   False]


# ----------------------------------------------------------------------------------------------- backoff


def test_backoff_first_restart_is_immediate_then_doubles_to_the_cap() -> None:
    b = RestartBackoff()
    now = 1000.0
    waits = []
    for _ in range(8):
        waits.append(b.wait_s(now))
        now += waits[-1]
        b.restarted(now)
    assert waits == [0, 10, 20, 40, 80, 160, 300, 300]


def test_backoff_is_forgotten_after_a_long_run() -> None:
    b = RestartBackoff()
    b.restarted(0)
    b.restarted(5)
    assert b.wait_s(6) == pytest.approx(19)
    assert b.wait_s(5 + 601) == 0
    b.restarted(606)
    assert b.delay_s == 10


# --------------------------------------------------------------------------------------------------- env


def test_env_values_field_refs_and_expansion() -> None:
    container = {"env": [
        {"name": "A", "value": "x"}, {"name": "B", "value": "$(A)-$(MISSING)-$$(A)"},
        {"name": "NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "SA", "valueFrom": {"fieldRef": {"fieldPath": "spec.serviceAccountName"}}},
    ]}
    assert env.container_env(POD, container) == {"A": "x", "B": "x-$(MISSING)-$(A)", "NAME": "p", "IP": "127.1.0.7",
                                                 "SA": "sa"}


@pytest.mark.parametrize(("selector", "kind"), [("secretKeyRef", "Secret"), ("configMapKeyRef", "ConfigMap")])
def test_env_takes_keys_by_reference_and_refuses_a_missing_one_in_kubelets_words_without_any_value(
        selector: str, kind: str) -> None:
    refs = [{"name": "K", "valueFrom": {selector: {"name": "s", "key": "k"}}},
            {"name": "O", "valueFrom": {selector: {"name": "s", "key": "absent", "optional": True}}},
            {"name": "G", "valueFrom": {selector: {"name": "gone", "key": "k", "optional": True}}},
            {"name": "D", "value": "id:$(K)"}]
    assert env.referenced([{"env": refs}, {"env": [{"name": "x", "value": "y"}]}]) == {(kind, "s"), (kind, "gone")}
    assert env.container_env(POD, {"env": refs}, {(kind, "s"): {"k": "hush"}}) == {"K": "hush", "D": "id:hush"}
    with pytest.raises(env.MissingKey, match=f"^env K: couldn't find key k in {kind} ns/s$") as refused:
        env.container_env(POD, {"env": refs}, {(kind, "s"): {"other": "hush"}})
    assert "hush" not in str(refused.value)
    with pytest.raises(env.MissingKey, match=f'^env K: {kind.lower()} "s" not found$'):
        env.container_env(POD, {"env": refs}, {})
    # A key of the same name in an object of the other kind is not it.
    other = "ConfigMap" if kind == "Secret" else "Secret"
    with pytest.raises(env.MissingKey):
        env.container_env(POD, {"env": refs}, {(other, "s"): {"k": "hush"}})


def test_a_missing_reference_is_told_apart_from_what_the_runner_never_emulates() -> None:
    # What may yet appear (kubelet retries it) is told apart from what the runner never emulates.
    with pytest.raises(env.EnvError) as never:
        env.container_env(POD, {"env": [{"name": "R", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu"}}}]})
    assert not isinstance(never.value, env.MissingKey)


@pytest.mark.parametrize("var", [
    {"name": "S", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
    {"name": "C", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}}},
    {"name": "L", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['x']"}}},
    {"name": "R", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu"}}},
])
def test_env_the_runner_cannot_resolve_is_refused_by_name(var: dict) -> None:
    with pytest.raises(env.EnvError, match=var["name"]):
        env.container_env(POD, {"env": [var]})


def test_the_contract_wins_over_the_container_and_nothing_of_the_runner_leaks() -> None:
    contract = env.contract_env(pod_ip="127.1.0.7", pod_dir="/d", kubeconfig="/d/kubeconfig")
    built = env.build(POD, {"env": [{"name": "KUBECONFIG", "value": "/etc/x"}, {"name": "MINE", "value": "1"}]},
                      base=env.base_env(path="/venv/bin", home="/d", hostname="p"), contract=contract)
    assert built["KUBECONFIG"] == "/d/kubeconfig"
    assert built["MINE"] == "1"
    assert built["PDFLEET_ENGINE_MODE"] == "simulate"
    assert built["PDFLEET_LEDGER_PATH"] == "/d/shm/pdfleet-ledger"
    assert built["HF_HUB_OFFLINE"] == "1"
    assert set(built) == {"PATH", "HOME", "HOSTNAME", "LANG", "PYTHONUNBUFFERED", "KUBECONFIG", "MINE",
                          *contract}


# --------------------------------------------------------------------------------------------- podinfo


def test_downward_api_format_is_kubelets() -> None:
    text = podinfo.format_map({"b": 'say "hi"\n', "a": "plain", "c": "tab\there\\"})
    assert text == 'a="plain"\nb="say \\"hi\\"\\n"\nc="tab\\there\\\\"'


def test_annotations_file_is_replaced_only_on_change(tmp_path: Path) -> None:
    assert podinfo.write_annotations(tmp_path, {"k": "v"})
    assert (tmp_path / "annotations").read_text() == 'k="v"'
    assert not podinfo.write_annotations(tmp_path, {"k": "v"})
    assert podinfo.write_annotations(tmp_path, {"k": "w"})
    assert [p.name for p in tmp_path.iterdir()] == ["annotations"]


def test_secret_files_are_written_private(tmp_path: Path) -> None:
    podinfo.write_atomically(tmp_path / "kubeconfig", "token", mode=0o600)
    assert (tmp_path / "kubeconfig").stat().st_mode & 0o777 == 0o600


# -------------------------------------------------------------------------------------------- commands


def test_engine_runs_the_launcher_in_the_zygote() -> None:
    c = {"command": ["python3", "-m", "pdfleet.runtime.launcher"], "args": ["--patch=x", "--", "--port", "1"]}
    assert commands.plan(c, pod_ip="127.1.0.7", python="/v/python") == commands.Launch(("--patch=x", "--", "--port",
                                                                                        "1"))


def test_router_runs_its_module_in_the_zygote_on_the_pod_ip() -> None:
    c = {"command": ["python3", "-m", "sglang_router.launch_router"],
         "args": ["--host", "0.0.0.0", "--port", "8000", "--prometheus-host=0.0.0.0", "--x", "0.0.0.0"]}
    plan = commands.plan(c, pod_ip="127.1.0.7", python="/v/python")
    assert plan == commands.Module("sglang_router.launch_router", ("--host", "127.1.0.7", "--port", "8000",
                                                                   "--prometheus-host=127.1.0.7", "--x", "0.0.0.0"))


def test_args_take_the_containers_own_variables_as_kubelet_expands_them() -> None:
    c = {"command": ["python3", "-m", "sglang_router.launch_router"],
         "args": ["--control-plane-api-keys", "op:operator:admin:$(KEY)", "--other", "$(UNSET)", "$$(KEY)"]}
    plan = commands.plan(c, pod_ip="127.1.0.7", python="/v/python", variables={"KEY": "hush"})
    assert plan == commands.Module("sglang_router.launch_router", ("--control-plane-api-keys",
                                                                   "op:operator:admin:hush", "--other", "$(UNSET)",
                                                                   "$(KEY)"))


def test_chart_operator_runs_the_operator_on_the_pod_ip() -> None:
    c = {"name": "operator", "image": "ghcr.io/pdfleet/pdfleet-operator:0.1.0", "args": ["--metrics-port=9090"]}
    assert commands.plan(c, pod_ip="127.1.4.2", python="/v/python") == commands.Exec(
        ("/v/python", "-m", "pdfleet.operator", "--metrics-port=9090", "--bind-address=127.1.4.2"))


def test_other_commands_run_as_written_with_python3_mapped() -> None:
    c = {"command": ["python3", "-c", "print(1)"], "args": ["python3"]}
    assert commands.plan(c, pod_ip="127.1.0.7", python="/v/python") == commands.Exec(
        ("/v/python", "-c", "print(1)", "python3"))
    with pytest.raises(commands.CommandError, match="no command"):
        commands.plan({"name": "x", "image": "busybox"}, pod_ip="127.1.0.7", python="/v/python")


# ---------------------------------------------------------------------------------------------- status


def view(state: dict, ready: bool = False) -> status.ContainerView:
    return status.ContainerView("c", "img", state, ready=ready)


def test_phase_follows_restart_policy() -> None:
    failed = status.terminated(code=3, sig=None, started_at=0, finished_at=1)
    ok = status.terminated(code=0, sig=None, started_at=0, finished_at=1)
    assert status.phase("Never", [view(failed)]) == "Failed"
    assert status.phase("Never", [view(ok)]) == "Succeeded"
    assert status.phase("OnFailure", [view(failed)]) == "Running"
    assert status.phase("Always", [view(ok)]) == "Running"
    assert status.phase("Never", [view(status.running(0))]) == "Running"


def test_terminated_by_signal_reads_like_a_runtime() -> None:
    t = status.terminated(code=None, sig=9, started_at=0, finished_at=1)["terminated"]
    assert (t["exitCode"], t["reason"], t["signal"]) == (137, "Error", 9)
    assert status.terminated(code=0, sig=None, started_at=0, finished_at=1)["terminated"]["reason"] == "Completed"


def test_log_tail_is_bounded() -> None:
    text = "".join(f"line {i}\n" for i in range(1000))
    tail = status.log_tail(text)
    assert tail.endswith("line 999") and len(tail.encode()) <= 2048 and tail.count("\n") < 80


def test_pod_patch_keeps_other_conditions_and_moves_ready_with_containers_ready() -> None:
    patch = status.pod_patch(phase_now="Running", ready=False, ready_since=0, containers=[view(status.running(0))],
                             other_conditions=[{"type": "PodScheduled", "status": "True"},
                                               {"type": "Ready", "status": "True"}])
    conditions = {c["type"]: c["status"] for c in patch["status"]["conditions"]}
    assert conditions == {"PodScheduled": "True", "Ready": "False", "ContainersReady": "False"}
    assert patch["status"]["containerStatuses"][0]["state"] == {"running": {"startedAt": "1970-01-01T00:00:00Z"}}
