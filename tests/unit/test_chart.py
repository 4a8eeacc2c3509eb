"""The Helm chart renders a least-privilege, locked-down operator, and its schema refuses bad values.

Runs the real `helm` (lint and template, no cluster). The RBAC tables below are the contract: a rule that
widens the operator's permissions fails here until the table is changed with it, on purpose.
"""

from __future__ import annotations

import functools
import itertools
import os
import subprocess
import tomllib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
import yaml

from hack.localcluster import pinned

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "pdfleet"
RELEASE, RELEASE_NS = "pdfleet", "pdfleet-system"
_CACHE = Path(os.environ.get("PDFLEET_CACHE") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
              / "pdfleet")
BIN = Path(os.environ.get("PDFLEET_BIN") or _CACHE / "bin")

Rules = dict[tuple[str, str], frozenset[str]]


def _verbs(*verbs: str) -> frozenset[str]:
    return frozenset(verbs)


READ = ("get", "list", "watch")
# What the operator may do in every namespace it watches: resource (group, plural) -> verbs.
NAMESPACED_RULES: Rules = {
    ("pdfleet.dev", "inferencepools"): _verbs(*READ, "patch"),
    ("pdfleet.dev", "inferencepools/status"): _verbs("get", "patch", "update"),
    ("pdfleet.dev", "inferencepools/finalizers"): _verbs("update"),
    ("pdfleet.dev", "inferencepoolroles"): _verbs(*READ, "create", "patch", "delete"),
    ("pdfleet.dev", "inferencepoolroles/status"): _verbs("patch"),
    ("", "pods"): _verbs(*READ, "create", "delete", "patch"),
    ("", "services"): _verbs(*READ, "create", "patch", "delete"),
    ("", "configmaps"): _verbs(*READ, "create", "patch", "delete"),
    ("", "secrets"): _verbs("get", "create", "patch"),  # the pools' router keys, by name only
    ("", "serviceaccounts"): _verbs(*READ, "create", "patch"),
    ("apps", "deployments"): _verbs(*READ, "create", "patch", "delete"),
    ("", "events"): _verbs("create", "patch"),
    ("events.k8s.io", "events"): _verbs("create", "patch"),
    ("rbac.authorization.k8s.io", "roles"): _verbs(*READ, "create", "patch", "delete"),
    ("rbac.authorization.k8s.io", "rolebindings"): _verbs(*READ, "create", "patch", "delete"),
    ("networking.k8s.io", "networkpolicies"): _verbs(*READ, "create", "patch", "delete"),
    ("policy", "poddisruptionbudgets"): _verbs(*READ, "create", "patch", "delete"),
    ("kueue.x-k8s.io", "workloads"): _verbs("get"),  # why Kueue holds a gang, by name only
}
CRD_DISCOVERY_RULES: Rules = {("apiextensions.k8s.io", "customresourcedefinitions"): _verbs(*READ)}
NAMESPACE_RULES: Rules = {("", "namespaces"): _verbs("list", "watch")}
CLUSTER_WIDE_RULES: Rules = NAMESPACED_RULES | CRD_DISCOVERY_RULES | NAMESPACE_RULES
# RBAC cannot restrict create by name; get and update only the release's own Lease (`leases[<name>]`).
LEADER_ELECTION_RULES: Rules = {("coordination.k8s.io", "leases"): _verbs("create"),
                                ("coordination.k8s.io", "leases[pdfleet]"): _verbs("get", "update")}
# The router's Role, which the operator creates, grants these; RBAC lets it only grant what it holds.
ROUTER_DISCOVERY_RULES: Rules = {("", "pods"): _verbs(*READ)}

SCENARIOS: dict[str, dict[str, Any]] = {
    "default": {},
    "namespaced": {"watchNamespaces": ["team-a", "team-b"]},
    "service-monitor": {"metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "prom"}}}},
    "single-replica": {"replicaCount": 1},
    "no-leader-election": {"replicaCount": 1, "leaderElection": {"enabled": False}},
    "operator-disabled": {"operator": {"enabled": False}},
    "scaled-to-zero": {"replicaCount": 0},
}
RBAC_KINDS = ("ClusterRole", "Role")


def kube_version() -> str:
    return pinned("KUBE_VERSION")


def helm(*args: str, values: dict[str, Any] | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Runs the real helm; `values` go in through stdin (`--values -`)."""
    binary = BIN / "helm"
    if not os.access(binary, os.X_OK):
        pytest.fail(f"helm is not installed at {binary}: run `make binaries`", pytrace=False)
    if values:
        args = (*args, "--values", "-")
    proc = subprocess.run([str(binary), *args], input=yaml.safe_dump(values or {}), text=True,
                          capture_output=True, timeout=60)
    if check and proc.returncode != 0:
        pytest.fail(f"helm {' '.join(args)} exited {proc.returncode}:\n{proc.stderr}{proc.stdout}", pytrace=False)
    return proc


def template(values: dict[str, Any], *, extra: tuple[str, ...] = (), check: bool = True
             ) -> subprocess.CompletedProcess[str]:
    # The kube version is the one the local control plane runs (offline, a helm built from source assumes 1.20).
    return helm("template", RELEASE, str(CHART), "--namespace", RELEASE_NS, "--kube-version", kube_version(),
                *extra, values=values, check=check)


def documents(text: str) -> tuple[dict[str, Any], ...]:
    return tuple(doc for doc in yaml.safe_load_all(text) if doc)


@functools.cache
def render(scenario: str) -> tuple[dict[str, Any], ...]:
    return documents(template(SCENARIOS[scenario]).stdout)


def of_kind(docs: Iterable[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def one(docs: Iterable[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = of_kind(docs, kind)
    assert len(found) == 1, f"expected one {kind}, found {[d['metadata']['name'] for d in found]}"
    return found[0]


USER_ROLE_SUFFIXES = ("-view", "-edit")  # templates/user-roles.yaml: for people, not the operator


def operator_cluster_role(docs: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """The operator's one ClusterRole (the user roles aside)."""
    return one([d for d in of_kind(docs, "ClusterRole") if not d["metadata"]["name"].endswith(USER_ROLE_SUFFIXES)],
               "ClusterRole")


def rule_table(role: dict[str, Any]) -> Rules:
    table: dict[tuple[str, str], set[str]] = {}
    for rule in role.get("rules") or []:
        assert set(rule) <= {"apiGroups", "resources", "resourceNames", "verbs"}, f"unexpected rule fields in {rule}"
        names = rule.get("resourceNames")
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                keys = [f"{resource}[{name}]" for name in names] if names else [resource]
                for key in keys:
                    table.setdefault((group, key), set()).update(rule["verbs"])
    return {key: frozenset(verbs) for key, verbs in table.items()}


def format_table(table: Rules) -> str:
    return "\n".join(f"  {g or 'core'}/{r}: {sorted(v)}" for (g, r), v in sorted(table.items()))


def assert_rules(role: dict[str, Any], expected: Rules) -> None:
    got = rule_table(role)
    widened = {k: v - expected.get(k, frozenset()) for k, v in got.items()}
    narrowed = {k: v - got.get(k, frozenset()) for k, v in expected.items()}
    assert got == expected, (
        f"{role['kind']} {role['metadata']['name']} differs from the RBAC table in tests/unit/test_chart.py\n"
        f"granted beyond the table:\n{format_table({k: v for k, v in widened.items() if v}) or '  nothing'}\n"
        f"in the table but not granted:\n{format_table({k: v for k, v in narrowed.items() if v}) or '  nothing'}\n"
        "A wider grant must be justified and added to the table in the same change.")


def deployment_pod(scenario: str = "default") -> dict[str, Any]:
    return one(render(scenario), "Deployment")["spec"]["template"]["spec"]


def operator_container(scenario: str = "default") -> dict[str, Any]:
    (container,) = deployment_pod(scenario)["containers"]
    return container


# --- lint and schema ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_the_chart_passes_strict_lint(scenario: str) -> None:
    result = helm("lint", "--strict", str(CHART), "--namespace", RELEASE_NS, "--kube-version", kube_version(),
                  values=SCENARIOS[scenario])
    assert "0 chart(s) failed" in result.stdout


@pytest.mark.parametrize(("values", "message"), [
    ({"replicaCount": "two"}, "/replicaCount': got string, want integer"),
    ({"replicaCount": -1}, "/replicaCount'"),
    ({"replicaCuont": 1}, "additional properties 'replicaCuont' not allowed"),
    ({"metrics": {"serviceMonitor": {"enable": True}}}, "additional properties 'enable' not allowed"),
    ({"logFormat": "xml"}, "/logFormat': value must be one of"),
    ({"logLevel": "verbose"}, "/logLevel': value must be one of"),
    ({"image": {"pullPolicy": "Sometimes"}}, "/image/pullPolicy'"),
    ({"healthPort": 0}, "/healthPort'"),
    ({"watchNamespaces": ["Not_A_Namespace"]}, "/watchNamespaces/0'"),
    ({"resources": {"limits": {"memory": "lots"}}}, "/resources/limits/memory'"),
    ({"image": {"digest": "sha256:abc"}}, "/image/digest'"),
    ({"image": {"digest": "deadbeef" * 8}}, "/image/digest'"),
    ({"runtime": {"image": {"digest": "sha256:" + "A" * 64}}}, "/runtime/image/digest'"),
    ({"runtime": {"image": {"digest": "sha512:" + "a" * 64}}}, "/runtime/image/digest'"),
    ({"runtime": {"image": {"repository": "ghcr.io/pdfleet/pdfleet-runtime:0.1.0"}}}, "/runtime/image/repository'"),
    ({"runtime": {"image": {"tag": "0.1.0@sha256:" + "a" * 64}}}, "/runtime/image/tag'"),
    ({"runtime": {"imag": {}}}, "additional properties 'imag' not allowed"),
])
def test_a_bad_value_is_rejected_by_the_schema_with_a_message_naming_it(values: dict[str, Any],
                                                                         message: str) -> None:
    rendered = template(values, check=False)
    assert rendered.returncode != 0
    assert "don't meet the specifications of the schema" in rendered.stderr
    assert message in rendered.stderr
    linted = helm("lint", "--strict", str(CHART), "--kube-version", kube_version(), values=values, check=False)
    assert linted.returncode != 0
    assert message in linted.stdout + linted.stderr


def test_more_than_one_replica_without_leader_election_is_refused_with_the_reason() -> None:
    result = template({"replicaCount": 2, "leaderElection": {"enabled": False}}, check=False)
    assert result.returncode != 0
    assert "only one replica may be active" in result.stderr


def test_the_health_and_metrics_ports_must_differ() -> None:
    result = template({"healthPort": 9090}, check=False)
    assert result.returncode != 0
    assert "need their own ports" in result.stderr


def test_not_creating_the_service_account_requires_naming_one() -> None:
    result = template({"serviceAccount": {"create": False}}, check=False)
    assert result.returncode != 0
    assert "serviceAccount.name is required" in result.stderr


def test_the_chart_metadata_pins_api_v2_its_versions_and_the_minimum_kubernetes() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["apiVersion"] == "v2"
    assert chart["name"] == "pdfleet"
    assert chart["version"] == "0.1.0"
    assert chart["appVersion"] == "0.1.0"
    # None: helm checks kubeVersion even offline, against its default; templates/validate.yaml checks clusters.
    assert "kubeVersion" not in chart


# --- the operator pod --------------------------------------------------------------------------------------


def test_the_operator_pod_runs_as_non_root_65532_with_the_runtime_default_seccomp_profile() -> None:
    pod = deployment_pod()
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 65532
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}


def test_the_operator_container_has_a_read_only_root_no_escalation_and_no_capabilities() -> None:
    sc = operator_container()["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert sc.get("privileged") is not True


def test_the_operator_gets_a_writable_tmp_and_its_api_token() -> None:
    pod = deployment_pod()
    (tmp,) = [v for v in pod["volumes"] if v["name"] == "tmp"]
    assert "emptyDir" in tmp
    assert {"name": "tmp", "mountPath": "/tmp"} in operator_container()["volumeMounts"]
    assert pod["automountServiceAccountToken"] is True
    assert pod["serviceAccountName"] == RELEASE


def test_the_operator_has_resource_requests_and_a_memory_limit() -> None:
    resources = operator_container()["resources"]
    assert set(resources["requests"]) == {"cpu", "memory"}
    assert "memory" in resources["limits"]


def test_liveness_and_readiness_probe_the_health_port() -> None:
    container = operator_container()
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"health": 8080, "metrics": 9090}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "health"}


def test_cluster_wide_mode_runs_the_operator_on_all_namespaces_with_json_logs() -> None:
    args = operator_container()["args"]
    assert "--all-namespaces" in args
    assert not [a for a in args if a.startswith("--namespace")]
    assert {"--metrics-port=9090", "--health-port=8080", "--log-format=json", "--log-level=info"} <= set(args)


def test_namespaced_mode_passes_one_namespace_flag_per_watched_namespace() -> None:
    args = operator_container("namespaced")["args"]
    assert "--all-namespaces" not in args
    assert [a for a in args if a.startswith("--namespace")] == ["--namespace=team-a", "--namespace=team-b"]


def test_the_operator_learns_its_pod_name_for_its_leader_election_identity() -> None:
    env = {e["name"]: e for e in operator_container()["env"]}
    assert env["POD_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert "PDFLEET_OPERATOR_NAMESPACE" not in env, "nothing reads it: the Lease namespace is a flag"


def test_without_leader_election_the_single_replica_is_replaced_by_recreate_so_two_never_overlap() -> None:
    spec = one(render("no-leader-election"), "Deployment")["spec"]
    assert spec["replicas"] == 1
    assert spec["strategy"] == {"type": "Recreate"}
    assert not [a for a in operator_container("no-leader-election")["args"] if a.startswith("--leader-elect")]


@pytest.mark.parametrize("scenario", ["default", "single-replica"])
def test_with_leader_election_a_rollout_starts_a_standby_before_it_stops_the_leader(scenario: str) -> None:
    spec = one(render(scenario), "Deployment")["spec"]
    assert spec["replicas"] == (2 if scenario == "default" else 1)
    assert spec["strategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    env = {e["name"]: e for e in operator_container(scenario)["env"]}
    assert env["POD_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}


def test_the_image_tag_defaults_to_the_app_version() -> None:
    assert operator_container()["image"].endswith(":0.1.0")


# --- the images ------------------------------------------------------------------------------------------------

DIGEST = "sha256:" + "0123456789abcdef" * 4


def app_version() -> str:
    return yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]


def operator_container_of(values: dict[str, Any]) -> dict[str, Any]:
    (container,) = one(documents(template(values).stdout), "Deployment")["spec"]["template"]["spec"]["containers"]
    return container


def runtime_image_arg(values: dict[str, Any]) -> str:
    (arg,) = [a for a in operator_container_of(values)["args"] if a.startswith("--runtime-image=")]
    return arg.removeprefix("--runtime-image=")


def test_the_defaults_name_the_images_this_project_builds_at_the_charts_app_version() -> None:
    version = app_version()
    assert version == tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert operator_container()["image"] == f"ghcr.io/pdfleet/pdfleet-operator:{version}"
    assert runtime_image_arg({}) == f"ghcr.io/pdfleet/pdfleet-runtime:{version}"


def test_the_chart_and_the_operator_default_to_the_same_runtime_image_and_the_chart_always_passes_it() -> None:
    """One source of truth: the chart passes --runtime-image whatever its values, and an operator started without
    the flag (out of cluster, by hand) uses the same image the chart's defaults name."""
    from pdfleet.operator.__main__ import _render_settings, parse_args
    from pdfleet.operator.render.context import DEFAULT_RUNTIME_IMAGE

    assert runtime_image_arg({}) == DEFAULT_RUNTIME_IMAGE
    assert _render_settings(parse_args([])).runtime_image == DEFAULT_RUNTIME_IMAGE
    for scenario in SCENARIOS:
        deployments = of_kind(render(scenario), "Deployment")
        assert all(any(a.startswith("--runtime-image=") for a in d["spec"]["template"]["spec"]["containers"][0]["args"])
                   for d in deployments), scenario


@pytest.mark.parametrize(("image", "reference"), [
    ({}, "{repo}:{version}"),
    ({"tag": "0.2.0"}, "{repo}:0.2.0"),
    ({"digest": DIGEST}, "{repo}@" + DIGEST),
    ({"tag": "0.2.0", "digest": DIGEST}, "{repo}:0.2.0@" + DIGEST),
    ({"repository": "127.0.0.1:5000/mirror/img", "digest": DIGEST}, "127.0.0.1:5000/mirror/img@" + DIGEST),
])
def test_an_image_renders_with_its_tag_and_digest(image: dict[str, str], reference: str) -> None:
    """Both images follow the same rule: a digest pins (the tag shown only when given), else tag or appVersion."""
    version = app_version()
    repo = image.get("repository")
    assert operator_container_of({"image": image})["image"] == reference.format(
        repo=repo or "ghcr.io/pdfleet/pdfleet-operator", version=version)
    assert runtime_image_arg({"runtime": {"image": image}}) == reference.format(
        repo=repo or "ghcr.io/pdfleet/pdfleet-runtime", version=version)


def test_the_runtime_image_the_chart_passes_reaches_the_engine_pods_init_container() -> None:
    from pdfleet.operator.__main__ import _render_settings, parse_args
    from pdfleet.operator.render.context import RenderContext

    pinned = f"127.0.0.1:5000/pdfleet/pdfleet-runtime:0.1.0@{DIGEST}"
    args = operator_container_of({"runtime": {"image": {"repository": "127.0.0.1:5000/pdfleet/pdfleet-runtime",
                                                        "tag": "0.1.0", "digest": DIGEST}}})["args"]
    settings = _render_settings(parse_args(args))
    assert settings.runtime_image == pinned
    body = {"metadata": {"name": "p", "namespace": "ns", "uid": "u"}}
    assert RenderContext.of(body, settings).runtime_image == pinned  # what render/engine_group.py puts in the pod


def test_the_deployment_can_be_disabled_or_scaled_to_zero_while_the_account_and_rbac_stay() -> None:
    disabled = render("operator-disabled")
    assert not of_kind(disabled, "Deployment")
    assert not of_kind(disabled, "Service")
    assert one(disabled, "ServiceAccount")["metadata"]["name"] == RELEASE
    assert_rules(operator_cluster_role(disabled), CLUSTER_WIDE_RULES)
    assert one(render("scaled-to-zero"), "Deployment")["spec"]["replicas"] == 0


def test_the_service_account_name_is_the_full_name_and_can_be_overridden() -> None:
    assert one(render("default"), "ServiceAccount")["metadata"]["name"] == RELEASE
    docs = documents(template({"serviceAccount": {"name": "custom"}}).stdout)
    assert one(docs, "ServiceAccount")["metadata"]["name"] == "custom"
    assert one(docs, "ClusterRoleBinding")["subjects"][0]["name"] == "custom"
    assert deployment_pod_of(docs)["serviceAccountName"] == "custom"


def deployment_pod_of(docs: Iterable[dict[str, Any]]) -> dict[str, Any]:
    return one(docs, "Deployment")["spec"]["template"]["spec"]


# --- RBAC --------------------------------------------------------------------------------------------------


def test_cluster_wide_mode_grants_exactly_the_operator_table_through_one_cluster_role() -> None:
    docs = render("default")
    # The only Role is leader election's, for its Lease.
    assert [r["metadata"]["name"] for r in of_kind(docs, "Role")] == ["pdfleet-leader-election"]
    assert_rules(operator_cluster_role(docs), CLUSTER_WIDE_RULES)


def test_namespaced_mode_grants_the_table_by_a_role_in_each_watched_namespace() -> None:
    docs = render("namespaced")
    roles = [r for r in of_kind(docs, "Role") if not r["metadata"]["name"].endswith("-leader-election")]
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["team-a", "team-b"]
    for role in roles:
        assert_rules(role, NAMESPACED_RULES)
    bindings = [b for b in of_kind(docs, "RoleBinding") if not b["metadata"]["name"].endswith("-leader-election")]
    assert sorted(b["metadata"]["namespace"] for b in bindings) == ["team-a", "team-b"]


def test_namespaced_mode_has_no_cluster_role_granting_pods_or_anything_but_discovery() -> None:
    """CRDs, and namespace objects: kopf lists those in namespaced mode too, and a refusal held the operator's
    first reconcile back about 40 s at every start on a real node (tests/integration/test_real_node_chart.py)."""
    cluster_role = operator_cluster_role(render("namespaced"))
    assert ("", "pods") not in rule_table(cluster_role)
    assert_rules(cluster_role, CRD_DISCOVERY_RULES | NAMESPACE_RULES)


def test_leases_are_granted_only_with_leader_election_and_only_in_the_release_namespace() -> None:
    for scenario in SCENARIOS:
        for role in of_kind(render(scenario), "ClusterRole"):  # the user roles' too
            assert not any(group == "coordination.k8s.io" for group, _ in rule_table(role))
    assert not any(group == "coordination.k8s.io" for r in of_kind(render("no-leader-election"), "Role")
                   for group, _ in rule_table(r))
    (role,) = of_kind(render("default"), "Role")
    assert role["metadata"]["namespace"] == RELEASE_NS
    assert_rules(role, LEADER_ELECTION_RULES)


def test_the_chart_passes_the_leader_election_flags_the_operator_accepts() -> None:
    from pdfleet.operator.__main__ import parse_args

    args = operator_container()["args"]
    assert {"--leader-elect", f"--leader-elect-namespace={RELEASE_NS}", "--leader-elect-id=pdfleet"} <= set(args)
    parsed = parse_args(args)
    assert (parsed.leader_elect, parsed.leader_elect_namespace, parsed.leader_elect_id) == (True, RELEASE_NS,
                                                                                            "pdfleet")
    assert (parsed.leader_elect_lease_duration, parsed.leader_elect_renew_deadline,
            parsed.leader_elect_retry_period) == (15, 10, 2)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_no_rule_grants_listing_secrets_pods_exec_or_a_wildcard(scenario: str) -> None:
    for role in (d for d in render(scenario) if d["kind"] in RBAC_KINDS):
        for rule in role["rules"]:
            fields = [*rule["apiGroups"], *rule["resources"], *rule["verbs"]]
            assert "*" not in fields, f"wildcard in {role['kind']} {role['metadata']['name']}: {rule}"
            if "secrets" in rule["resources"]:
                # The router-key Secrets, by name: reading every Secret in scope would take list or watch.
                assert set(rule["verbs"]) == {"get", "create", "patch"} and rule["resources"] == ["secrets"], \
                    f"{role['kind']} {role['metadata']['name']} grants {rule}"
            assert "pods/exec" not in rule["resources"]
            assert not {"escalate", "bind", "impersonate"} & set(rule["verbs"])


@pytest.mark.parametrize("scenario", ["default", "namespaced"])
def test_wherever_the_operator_may_create_roles_it_holds_what_the_router_role_grants(scenario: str) -> None:
    for role in (d for d in render(scenario) if d["kind"] in RBAC_KINDS):
        table = rule_table(role)
        if "create" in table.get(("rbac.authorization.k8s.io", "roles"), ()):
            for resource, verbs in ROUTER_DISCOVERY_RULES.items():
                assert verbs <= table.get(resource, frozenset()), (
                    f"{role['kind']} {role['metadata']['name']} may create Roles but lacks {resource}: {verbs}")


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_binding_binds_only_the_operator_service_account(scenario: str) -> None:
    docs = render(scenario)
    roles = {(d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"])
             for d in docs if d["kind"] in RBAC_KINDS}
    for binding in (d for d in docs if d["kind"] in ("ClusterRoleBinding", "RoleBinding")):
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": RELEASE, "namespace": RELEASE_NS}]
        ref = binding["roleRef"]
        namespace = binding["metadata"].get("namespace") if ref["kind"] == "Role" else None
        assert (ref["kind"], namespace, ref["name"]) in roles, f"{binding['metadata']['name']} binds a missing role"


# --- metrics, labels, notes --------------------------------------------------------------------------------


def test_the_metrics_service_exposes_a_port_named_metrics_on_the_operator_pod() -> None:
    docs = render("default")
    service = one(docs, "Service")
    assert service["spec"]["ports"] == [{"name": "metrics", "port": 9090, "targetPort": "metrics", "protocol": "TCP"}]
    pod_labels = one(docs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert not of_kind(docs, "ServiceMonitor")


def test_the_service_monitor_scrapes_the_metrics_port_of_the_metrics_service() -> None:
    docs = render("service-monitor")
    monitor = one(docs, "ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["labels"]["release"] == "prom"
    assert [e["port"] for e in monitor["spec"]["endpoints"]] == ["metrics"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= one(docs, "Service")["metadata"]["labels"].items()


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_object_carries_the_standard_labels(scenario: str) -> None:
    for doc in render(scenario):
        labels = doc["metadata"]["labels"]
        assert labels["app.kubernetes.io/name"] == "pdfleet"
        assert labels["app.kubernetes.io/instance"] == RELEASE
        assert labels["app.kubernetes.io/version"] == "0.1.0"
        assert labels["app.kubernetes.io/managed-by"] == "Helm"
        assert labels["helm.sh/chart"] == "pdfleet-0.1.0"


def test_the_notes_tell_how_to_watch_a_pool_and_its_events() -> None:
    notes = (CHART / "templates" / "NOTES.txt").read_text()
    assert "kubectl get pdpool" in notes
    assert "--field-selector involvedObject.kind=InferencePool" in notes


# --- the operator image matches the chart ------------------------------------------------------------------


def test_the_image_runs_as_the_user_the_chart_requires_and_exposes_its_ports() -> None:
    from hack.images import build  # `make images` (docs/images.md)

    image = next(i for i in build.images() if i.name == "pdfleet-operator")
    assert image.config.user == "65532:65532"
    assert image.config.entrypoint == ("pdfleet-operator",)
    assert tuple(image.config.exposed_ports) == (8080, 9090)
    assert deployment_pod()["securityContext"]["runAsUser"] == 65532


def test_the_readme_s_permission_table_is_the_operator_s_table() -> None:
    """charts/pdfleet/README.md's table of the operator's rules, read as rules: the same as NAMESPACED_RULES (and so
    as the chart), so the README cannot omit or invent a permission."""
    text = (CHART / "README.md").read_text()
    lines = text.split("## Permissions (least privilege)", 1)[1].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| API group"))
    block = itertools.takewhile(lambda line: line.startswith("|"), lines[start + 2:])  # after header and rule
    rows = list(block)
    table: dict[tuple[str, str], frozenset[str]] = {}
    for row in rows:
        groups, resources, verbs = (cell.strip() for cell in row.strip("|").split("|")[:3])
        for group in groups.split(", "):
            for resource in resources.split(", "):
                table[("" if group == "core" else group.strip("`"), resource.strip("`"))] = \
                    frozenset(v.strip() for v in verbs.split(","))
    assert table == NAMESPACED_RULES
