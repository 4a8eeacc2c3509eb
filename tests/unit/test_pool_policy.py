"""The pool policy (operator/api/pool_policy.py): what a pool may ask for that reaches past its namespace, decided
by the cluster admin. Here: the rules, the operator's refusal on reconcile, its flags, and the chart's admission
policy generated from the same rules. tests/integration/test_pool_policy.py runs hostile pools through the real
apiserver and the real operator."""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from pdfleet.operator.__main__ import _render_settings, parse_args
from pdfleet.operator.api import admission_policy, checks, pool_policy
from pdfleet.operator.api.pool_policy import ANY, PoolPolicy
from pdfleet.operator.api.spec import InferencePoolSpec
from pdfleet.operator.cache import Observed
from pdfleet.operator.planning import reconcile
from pdfleet.operator.render.context import Settings
from tests.support.pools import pool_body
from tests.unit.test_admission_warnings import SERVED
from tests.unit.test_chart import documents, one, template

ROOT = Path(__file__).resolve().parents[2]
NOW = datetime.datetime(2026, 12, 7, tzinfo=datetime.UTC)

# Each hostile pool: the spec updates (pool_body's), the field refused, and the policy that admits it.
EVERY_TAINT = [{"operator": "Exists"}]
HOSTILE: dict[str, tuple[dict[str, Any], str, PoolPolicy]] = {
    "hostPath /": ({"model__source": {"hostPath": {"path": "/"}}}, "spec.model.source.hostPath.path",
                   PoolPolicy(host_path_prefixes=(ANY,))),
    "hostPath /run/containerd": ({"model__source": {"hostPath": {"path": "/run/containerd"}}},
                                 "spec.model.source.hostPath.path", PoolPolicy(host_path_prefixes=("/run",))),
    "hostPath /var/lib/kubelet": ({"model__source": {"hostPath": {"path": "/var/lib/kubelet"}}},
                                  "spec.model.source.hostPath.path",
                                  PoolPolicy(host_path_prefixes=("/var/lib/kubelet",))),
    "system-node-critical": ({"decode__scheduling": {"priorityClassName": "system-node-critical"}},
                             "spec.decode.scheduling.priorityClassName",
                             PoolPolicy(priority_classes=("system-node-critical",))),
    "router priority": ({"router__scheduling": {"priorityClassName": "high"}},
                        "spec.router.scheduling.priorityClassName", PoolPolicy(priority_classes=(ANY,))),
    "every taint": ({"prefill__scheduling": {"tolerations": EVERY_TAINT}}, "spec.prefill.scheduling.tolerations[0]",
                    PoolPolicy(toleration_keys=(ANY,))),
    "control plane": ({"router__scheduling": {"tolerations": [
        {"key": "nvidia.com/gpu", "operator": "Exists"},
        {"key": "node-role.kubernetes.io/control-plane", "operator": "Exists"}]}},
        "spec.router.scheduling.tolerations[1]",
        PoolPolicy(toleration_keys=("node-role.kubernetes.io/control-plane",))),
    "engine image": ({"engine__image": "evil.example/miner:1"}, "spec.engine.image",
                     PoolPolicy(image_prefixes=("registry.example/", "evil.example/miner"))),
    "router image": ({"router__image": "evil.example/miner@sha256:" + "0" * 64}, "spec.router.image",
                     PoolPolicy(image_prefixes=("registry.example/", "evil.example/"))),
}
# The policy the hostile pools meet first: the defaults, with images limited to one registry.
STRICT = PoolPolicy(image_prefixes=("registry.example/",))
POLICY_FLAGS = ("--allow-", "--require-non-root-engines")


def spec_of(**updates: Any) -> InferencePoolSpec:
    body = pool_body(**{"engine__image": "registry.example/sglang:v1", **updates})
    return InferencePoolSpec.model_validate(body["spec"])


@pytest.mark.parametrize("case", list(HOSTILE))
def test_each_hostile_pool_is_refused_at_its_field_naming_the_policy_and_allowed_when_the_policy_allows_it(
        case: str) -> None:
    updates, field, allowing = HOSTILE[case]
    spec = spec_of(**updates)
    [problem] = pool_policy.problems(spec, STRICT)
    assert problem.path == field
    assert "the pool policy's" in problem.message and "chart value poolPolicy." in problem.message
    assert pool_policy.problems(spec, allowing) == []


def test_a_pool_at_its_defaults_meets_the_default_policy_and_so_does_the_gpu_taint() -> None:
    gpu = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert pool_policy.problems(spec_of(decode__scheduling={"tolerations": gpu}), PoolPolicy()) == []


def test_the_default_policy_allows_no_host_path_no_priority_class_no_extra_toleration_and_any_image() -> None:
    assert PoolPolicy() == PoolPolicy(host_path_prefixes=(), priority_classes=(), toleration_keys=(),
                                      image_prefixes=(ANY,), require_non_root_engines=False)


@pytest.mark.effect("spec.engine.runAsUser")
def test_a_policy_requiring_non_root_engines_refuses_a_pool_without_a_user_of_its_own() -> None:
    required = PoolPolicy(require_non_root_engines=True)
    [problem] = pool_policy.problems(spec_of(), required)
    assert problem.path == "spec.engine.runAsUser" and "--require-non-root-engines" in problem.message
    assert pool_policy.problems(spec_of(engine__runAsUser=1000), required) == []
    assert pool_policy.problems(spec_of(), PoolPolicy()) == []


@pytest.mark.parametrize(("path", "prefixes", "allowed"), [
    ("/mnt/models", ("/mnt/models",), True),
    ("/mnt/models/llama", ("/mnt/models",), True),
    ("/mnt/models/llama", ("/mnt/models/",), True),
    ("/mnt/models-secret", ("/mnt/models",), False),  # whole components only
    ("/mnt", ("/mnt/models",), False),
    ("/", ("/mnt/models",), False),
    ("/anything", ("/",), True),
    ("/anything", (ANY,), True),
    ("/anything", (), False),
])
def test_host_paths_are_allowed_by_whole_path_components(path: str, prefixes: tuple[str, ...],
                                                          allowed: bool) -> None:
    assert pool_policy.host_path_allowed(path, prefixes) is allowed


@pytest.mark.parametrize(("image", "prefixes", "allowed"), [
    ("registry.example/llm/sglang:v1", ("registry.example/",), True),
    ("registry.example.evil/sglang:v1", ("registry.example/",), False),
    ("docker.io/lmsysorg/sglang:v0.5.8", ("docker.io/lmsysorg/sglang",), True),
    ("docker.io/lmsysorg/sglang@sha256:" + "a" * 64, ("docker.io/lmsysorg/sglang",), True),
    ("docker.io/lmsysorg/sglang", ("docker.io/lmsysorg/sglang",), True),
    ("docker.io/lmsysorg/sglang-evil:1", ("docker.io/lmsysorg/sglang",), False),  # one repository, not a prefix
    ("lmsysorg/sglang:v1", ("docker.io/lmsysorg/",), False),  # compared as written
    ("anything:1", (ANY,), True),
])
def test_images_are_allowed_under_a_slash_ended_prefix_or_as_one_repository(image: str, prefixes: tuple[str, ...],
                                                                            allowed: bool) -> None:
    assert pool_policy.image_allowed(image, prefixes) is allowed


def test_a_hostpath_with_backsteps_is_refused_by_the_api_whatever_the_policy() -> None:
    _, problems = checks.validate_spec(pool_body(model__source={"hostPath": {"path": "/mnt/models/../../run"}})["spec"])
    assert [p.path for p in problems] == ["spec.model.source.hostPath.path"]
    assert "'..'" in problems[0].message


def plan(body: dict[str, Any], policy: PoolPolicy) -> Any:
    return reconcile.plan(body, Observed(pool=body, owned={}), now=NOW, settings=Settings(policy=policy))


def test_the_operator_refuses_a_pool_the_policy_forbids_creates_nothing_and_warns_once() -> None:
    body = pool_body(model__source={"hostPath": {"path": "/run/containerd"}})
    refused = plan(body, PoolPolicy())
    assert refused.rejected and not refused.apply and not refused.delete
    [accepted] = [c for c in refused.status["conditions"] if c["type"] == "Accepted"]
    assert (accepted["status"], accepted["reason"]) == ("False", "ForbiddenByPolicy")
    assert accepted["message"].startswith("spec.model.source.hostPath.path: /run/containerd is not a host folder")
    assert [(e.type, e.reason) for e in refused.events] == [("Warning", "PolicyRefused")]

    body["status"] = refused.status
    again = plan(body, PoolPolicy())
    assert again.events == () and again.rejected, "one Warning, not one per reconcile"

    allowed = plan(body, PoolPolicy(host_path_prefixes=("/run/containerd",)))
    assert not allowed.rejected and any(o["kind"] == "Pod" for o in allowed.apply)
    [accepted] = [c for c in allowed.status["conditions"] if c["type"] == "Accepted"]
    assert (accepted["status"], accepted["reason"]) == ("True", "Valid")


def test_an_invalid_spec_is_reported_as_invalid_before_the_policy_is_consulted() -> None:
    body = pool_body(model__source={"hostPath": {"path": "/run/../x"}})
    [accepted] = [c for c in plan(body, PoolPolicy()).status["conditions"] if c["type"] == "Accepted"]
    assert accepted["reason"] == "InvalidSpec"


def test_a_paused_pool_is_held_to_the_policy_and_accepted_once_it_meets_it() -> None:
    body = pool_body(paused=True, decode__scheduling={"priorityClassName": "system-node-critical"})
    assert plan(body, PoolPolicy()).rejected
    [accepted] = [c for c in plan(body, PoolPolicy(priority_classes=("system-node-critical",))).status["conditions"]
                  if c["type"] == "Accepted"]
    assert accepted["status"] == "True"


def test_the_flags_make_the_policy_and_an_image_flag_replaces_the_any_default() -> None:
    assert _render_settings(parse_args([])).policy == PoolPolicy()
    policy = _render_settings(parse_args([
        "--allow-host-path-prefix=/mnt/models", "--allow-host-path-prefix", "/data",
        "--allow-priority-class=gpu-high", "--allow-toleration-key=example.com/reserved",
        "--allow-image-prefix=registry.example/", "--require-non-root-engines"])).policy
    assert policy == PoolPolicy(host_path_prefixes=("/mnt/models", "/data"), priority_classes=("gpu-high",),
                                toleration_keys=("example.com/reserved",), image_prefixes=("registry.example/",),
                                require_non_root_engines=True)


@pytest.mark.parametrize("argv", [["--allow-host-path-prefix=models"], ["--allow-host-path-prefix=/a/../b"],
                                  ["--allow-image-prefix="]])
def test_a_malformed_policy_flag_stops_the_operator_naming_it(argv: list[str],
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_args(argv)
    assert argv[0].split("=")[0] in capsys.readouterr().err


def test_the_chart_s_admission_policy_is_the_one_pool_policy_generates() -> None:
    assert (ROOT / admission_policy.OUTPUT).read_text() == admission_policy.render(), \
        f"{admission_policy.OUTPUT} is stale: run `make crds`"


def policy_docs(values: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    docs = [d for d in documents(template(values, extra=SERVED).stdout)
            if d["metadata"]["name"].endswith("-pool-policy")]
    return one(docs, "ValidatingAdmissionPolicy"), one(docs, "ValidatingAdmissionPolicyBinding")


def test_the_chart_refuses_at_admission_with_its_values_written_in_and_passes_them_to_the_operator() -> None:
    values = {"poolPolicy": {"hostPathPrefixes": ["/mnt/models"], "priorityClasses": ["gpu-high"],
                             "tolerationKeys": ["example.com/reserved"], "imagePrefixes": ["registry.example/"],
                             "requireNonRootEngines": True}}
    policy, binding = policy_docs(values)
    assert binding["spec"]["validationActions"] == ["Deny"] and policy["spec"]["failurePolicy"] == "Fail"
    lists = {v["name"]: v["expression"] for v in policy["spec"]["variables"]}
    assert lists == {"hostPathPrefixes": '["/mnt/models"]', "priorityClasses": '["gpu-high"]',
                     "tolerationKeys": '["example.com/reserved"]', "imagePrefixes": '["registry.example/"]',
                     "requireNonRootEngines": "true"}
    deployment = one(documents(template(values).stdout), "Deployment")
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert _render_settings(parse_args([a for a in args if a.startswith(POLICY_FLAGS)])).policy == PoolPolicy(
        host_path_prefixes=("/mnt/models",), priority_classes=("gpu-high",),
        toleration_keys=("example.com/reserved",), image_prefixes=("registry.example/",),
        require_non_root_engines=True)


def test_the_chart_s_defaults_are_the_operator_s() -> None:
    deployment = one(documents(template({}).stdout), "Deployment")
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert _render_settings(parse_args([a for a in args if a.startswith(POLICY_FLAGS)])).policy == PoolPolicy()
    lists = {v["name"]: v["expression"] for v in policy_docs({})[0]["spec"]["variables"]}
    assert lists == {"hostPathPrefixes": "[]", "priorityClasses": "[]", "tolerationKeys": "[]",
                     "imagePrefixes": '["*"]', "requireNonRootEngines": "false"}


def test_only_spec_writes_are_judged_so_a_grandfathered_pool_can_still_be_deleted() -> None:
    policy, _ = policy_docs({})
    assert [c["expression"] for c in policy["spec"]["matchConditions"]] == [admission_policy.SPEC_WRITTEN]


def test_a_namespaced_release_refuses_in_its_namespaces_only() -> None:
    _, binding = policy_docs({"watchNamespaces": ["team-a"]})
    assert binding["spec"]["matchResources"]["namespaceSelector"]["matchExpressions"][0]["values"] == ["team-a"]


@pytest.mark.parametrize("values", [{"hostPathPrefixes": ["models"]}, {"hostPathPrefixes": ["/a/../b"]},
                                    {"imagePrefixes": ["two words"]}, {"priorityClasses": ["Not_A_Name"]}])
def test_a_malformed_policy_value_fails_the_install_naming_it(values: dict[str, Any]) -> None:
    result = template({"poolPolicy": values}, check=False)
    assert result.returncode != 0 and f"/poolPolicy/{next(iter(values))}/0" in result.stderr


def test_every_message_the_admission_policy_writes_is_pool_policy_s_own() -> None:
    """The CEL message of each rule, its blanks filled as the apiserver would, reads as the operator's problem."""
    for _, message in admission_policy.validations():
        assert "the pool policy\\'s" in message and "chart value poolPolicy." in message
    text = admission_policy.cel_message(pool_policy.image_message, "object.spec.engine.image", "image_prefixes")
    assert text.startswith("object.spec.engine.image + ' is not an image the pool policy\\'s imagePrefixes (' + ")


def test_every_example_pool_meets_the_default_policy_or_says_which_value_it_needs() -> None:
    """A reader applying an example on a cluster at the chart's defaults is either admitted or told why first."""
    needing = {}
    for path in sorted((ROOT / "examples").rglob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if not doc or doc.get("kind") != "InferencePool":
                continue
            problems = pool_policy.problems(InferencePoolSpec.model_validate(doc["spec"]), PoolPolicy())
            if problems:
                needing[path.relative_to(ROOT).as_posix()] = [p.path for p in problems]
                assert "poolPolicy." in path.read_text(), f"{path} needs a pool policy it does not name: {problems}"
    assert needing == {"examples/gang/multinode-gang.yaml": ["spec.model.source.hostPath.path"],
                       "examples/multinode-decode.yaml": ["spec.model.source.hostPath.path"],
                       "examples/real-node/pool.yaml": [f"spec.{part}.scheduling.tolerations[0]"
                                                        for part in ("prefill", "decode", "router")]}
