"""Generates the chart's pool-policy admission: a ValidatingAdmissionPolicy that refuses a pool asking for what the
chart's `poolPolicy` values do not allow, at `kubectl apply`, with the field and the policy named.

The rules and messages are pool_policy's, written out in CEL: each message is pool_policy's own function, called
with blanks that become CEL expressions, so the words cannot drift apart; the allowed lists are the chart's values,
which helm writes into the policy as CEL list literals. tests/integration/test_pool_policy.py runs one table of
hostile pools through both the apiserver and the operator. `make crds` regenerates the template;
tests/unit/test_pool_policy.py fails when the chart's copy is stale.

    python -m pdfleet.operator.api.admission_policy [--check]
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

from pdfleet.operator.api import admission_template, generated_file, pool_policy
from pdfleet.operator.api.admission_template import VAP_API

OUTPUT = Path("charts") / "pdfleet" / "templates" / "pool-policy.yaml"
LISTS = {"host_path_prefixes": "hostPathPrefixes", "priority_classes": "priorityClasses",
         "toleration_keys": "tolerationKeys", "image_prefixes": "imagePrefixes"}


SPEC_WRITTEN = ("request.operation == 'CREATE' || oldObject == null || !has(oldObject.spec) || "
                "object.spec != oldObject.spec")


def cel_string(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def cel_message(message: Callable[[str, str], str], value: str, field: str) -> str:
    """`message(value, allowed)` as a CEL expression, `value` being CEL and the allowed list the policy's."""
    blank_value, blank_list = "\x00value\x00", "\x00list\x00"
    text = message(blank_value, pool_policy.allowed_text(field, blank_list))
    variable = f"variables.{LISTS[field]}"
    listed = f"(size({variable}) == 0 ? 'none' : {variable}.join(', '))"
    parts = []
    for piece in text.replace(blank_value, "\x00V\x00").replace(blank_list, "\x00L\x00").split("\x00"):
        parts.append(value if piece == "V" else listed if piece == "L" else cel_string(piece) if piece else None)
    return " + ".join(p for p in parts if p)


def guarded(path: str, leaf: str) -> tuple[str, str]:
    """The CEL `has()` chain that `path.leaf` is set, under `object`, and the field's CEL name."""
    parts = [*path.split(".")[1:], leaf]  # the leading "spec" is object.spec
    names = ["object.spec"]
    for part in parts:
        names.append(f"{names[-1]}.{part}")
    return " && ".join(f"has({n})" for n in names[1:]), names[-1]


def host_path_ok(path: str) -> str:
    return (f"variables.hostPathPrefixes.exists(p, p == '*' || {path} == p || "
            f"{path}.startsWith(p.endsWith('/') ? p : p + '/'))")


def image_ok(image: str) -> str:
    return (f"variables.imagePrefixes.exists(p, p == '*' || (p.endsWith('/') ? {image}.startsWith(p) : "
            f"({image} == p || {image}.startsWith(p + ':') || {image}.startsWith(p + '@'))))")


def toleration_ok(t: str) -> str:
    gpu = json.dumps(list(pool_policy.GPU_TAINT_KEYS))
    return (f"('*' in variables.tolerationKeys || (has({t}.key) && {t}.key != '' && "
            f"({t}.key in {gpu} || {t}.key in variables.tolerationKeys)))")


def validations() -> list[tuple[str, str]]:
    """(expression, messageExpression) of every rule, in pool_policy's order."""
    out = []
    is_set, path = guarded("spec.model.source", "hostPath")
    field = "spec.model.source.hostPath.path"
    out.append((f"!({is_set}) || {host_path_ok(path + '.path')}",
                f"{cel_string(field + ': ')} + "
                f"{cel_message(pool_policy.host_path_message, path + '.path', 'host_path_prefixes')}"))
    out.append(("!variables.requireNonRootEngines || (has(object.spec.engine) && has(object.spec.engine.runAsUser))",
                cel_string(f"spec.engine.runAsUser: {pool_policy.NON_ROOT_MESSAGE}")))
    for field in ("spec.engine.image", "spec.router.image"):
        parent, leaf = field.rsplit(".", 1)
        is_set, image = guarded(parent, leaf)
        out.append((f"!({is_set}) || {image_ok(image)}",
                    f"{cel_string(field + ': ')} + {cel_message(pool_policy.image_message, image, 'image_prefixes')}"))
    for scheduling in pool_policy.SCHEDULING_PATHS:
        is_set, name = guarded(scheduling, "priorityClassName")
        out.append((f"!({is_set}) || {name} == '' || '*' in variables.priorityClasses || "
                    f"{name} in variables.priorityClasses",
                    f"{cel_string(scheduling + '.priorityClassName: ')} + "
                    f"{cel_message(pool_policy.priority_class_message, name, 'priority_classes')}"))
        is_set, tolerations = guarded(scheduling, "tolerations")
        refused = (f"{tolerations}.filter(t, !{toleration_ok('t')}).map(t, has(t.key) && t.key != '' ? "
                   f"'taint key ' + t.key : {cel_string(pool_policy.EVERY_TAINT)}).join(', ')")
        out.append((f"!({is_set}) || {tolerations}.all(t, {toleration_ok('t')})",
                    f"{cel_string(scheduling + '.tolerations: ')} + "
                    f"{cel_message(pool_policy.toleration_message, refused, 'toleration_keys')}"))
    return out


def render() -> str:
    """The chart template: the policy and its binding, rendered when the cluster serves admission policies;
    bound to the namespaces the release watches."""
    variables = "\n".join(
        f"    - name: {name}\n      expression: {{{{ toJson (toJson .Values.poolPolicy.{name}) }}}}"
        for name in LISTS.values()) + ("\n    - name: requireNonRootEngines\n      expression: "
                                       "{{ .Values.poolPolicy.requireNonRootEngines | toJson | quote }}")
    rules = "\n".join(f"    - expression: {json.dumps(expression)}\n      messageExpression: {json.dumps(message)}\n"
                      "      reason: Forbidden" for expression, message in validations())
    return f"""{{{{- /*
Generated by `python -m pdfleet.operator.api.admission_policy` (make crds) from operator/api/pool_policy.py: do not
edit. Refuses at admission what the operator's --allow-* flags (the same poolPolicy values) refuse on reconcile.
*/}}}}
{{{{- if .Capabilities.APIVersions.Has "{VAP_API}" }}}}
{admission_template.policy_head("pool-policy")}
  # A policy that cannot be evaluated refuses: the operator would refuse the pool anyway.
  failurePolicy: Fail
{admission_template.match_constraints()}
  # Only what writes the spec: a pool admitted before the policy was tightened can still be labelled, have its
  # finalizer removed and be deleted.
  matchConditions:
    - name: spec-written
      expression: {json.dumps(SPEC_WRITTEN)}
  variables:
{variables}
  validations:
{rules}
---
{admission_template.binding("pool-policy", "Deny")}
{{{{- end }}}}
"""


def main(argv: list[str] | None = None) -> int:
    return generated_file.main(render, OUTPUT, __doc__, argv)


if __name__ == "__main__":
    sys.exit(main())
