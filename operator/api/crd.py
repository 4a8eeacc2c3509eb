"""Generates pdfleet's CustomResourceDefinitions from the API models: InferencePool, and InferencePoolRole (one
role of a pool as a scale target, `role_scale`).

    python -m pdfleet.operator.api.crd            # rewrite crds/inferencepools.pdfleet.dev.yaml and its sibling
    python -m pdfleet.operator.api.crd --check    # exit 1 if a committed file is stale

Run from the repository root. The output is deterministic (same models, same bytes), so the committed CRD can
be diffed against a fresh rendering; a unit test does exactly that.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

from pdfleet.operator.api import meta, names, role_scale
from pdfleet.operator.api.pool import InferencePool
from pdfleet.operator.api.schema import structural_schema
from pdfleet.operator.api.spec import InferencePoolSpec
from pdfleet.operator.api.status import InferencePoolStatus

DEFAULT_OUTPUT = Path("crds") / f"{meta.CRD_NAME}.yaml"
REGENERATE = "python -m pdfleet.operator.api.crd"
HEADER = f"# Generated from pdfleet.operator.api by `{REGENERATE}`. Do not edit.\n"

PRINTER_COLUMNS: list[dict[str, Any]] = [
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase", "description": "One-word summary."},
    {"name": "Prefill", "type": "string", "jsonPath": ".status.prefill.summary",
     "description": "Ready/desired prefill groups."},
    {"name": "Decode", "type": "string", "jsonPath": ".status.decode.summary",
     "description": "Ready/desired decode groups."},
    {"name": "Revision", "type": "string", "jsonPath": ".status.currentRevision",
     "description": "Last verified engine revision."},
    {"name": "Verified", "type": "string", "jsonPath": '.status.conditions[?(@.type=="RolloutVerified")].status',
     "description": "RolloutVerified: True once every group of the update revision passed its gates, False when "
                    "a gate stopped the rollout."},
    {"name": "Update", "type": "string", "jsonPath": ".status.updateRevision", "priority": 1,
     "description": "Engine revision being rolled out."},
    {"name": "Paused", "type": "boolean", "jsonPath": ".spec.paused", "priority": 1,
     "description": "Whether reconciling engines is paused."},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]

ROLE_PRINTER_COLUMNS: list[dict[str, Any]] = [
    {"name": "Pool", "type": "string", "jsonPath": ".spec.pool", "description": "The InferencePool."},
    {"name": "Role", "type": "string", "jsonPath": ".spec.role", "description": "prefill or decode."},
    {"name": "Desired", "type": "integer", "jsonPath": ".spec.replicas", "description": "Engine groups asked for."},
    {"name": "Current", "type": "integer", "jsonPath": ".status.replicas",
     "description": "Engine groups of the role that exist."},
    {"name": "Ready", "type": "integer", "jsonPath": ".status.readyReplicas",
     "description": "Engine groups of the role that serve."},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


def openapi_schema() -> dict[str, Any]:
    """The openAPIV3Schema of the one version."""
    return {
        "type": "object",
        "description": (InferencePool.__doc__ or "").strip(),
        "required": ["spec"],
        # Only the root may read metadata.name in CEL: the pool's name must fit every name derived from it.
        "x-kubernetes-validations": names.to_crd(),
        "properties": {
            "apiVersion": {"type": "string", "description": "APIVersion of this object: pdfleet.dev/v1alpha1."},
            "kind": {"type": "string", "description": "Kind of this object: InferencePool."},
            "metadata": {"type": "object"},
            "spec": structural_schema(InferencePoolSpec),
            "status": structural_schema(InferencePoolStatus),
        },
    }


def _definition(*, crd_name: str, kind: str, list_kind: str, plural: str, singular: str,
                short_names: tuple[str, ...], subresources: dict[str, Any], columns: list[dict[str, Any]],
                schema: dict[str, Any]) -> dict[str, Any]:
    """A namespaced CustomResourceDefinition of pdfleet's group with one served and stored version."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": crd_name},
        "spec": {
            "group": meta.GROUP,
            "names": {"kind": kind, "listKind": list_kind, "plural": plural, "singular": singular,
                      "shortNames": list(short_names), "categories": list(meta.CATEGORIES)},
            "scope": "Namespaced",
            "versions": [{
                "name": meta.VERSION,
                "served": True,
                "storage": True,
                "subresources": subresources,
                "additionalPrinterColumns": columns,
                "schema": {"openAPIV3Schema": schema},
            }],
        },
    }


def crd() -> dict[str, Any]:
    """The InferencePool CustomResourceDefinition as a plain dict."""
    return _definition(crd_name=meta.CRD_NAME, kind=meta.KIND, list_kind=meta.LIST_KIND, plural=meta.PLURAL,
                       singular=meta.SINGULAR, short_names=meta.SHORT_NAMES, subresources={"status": {}},
                       columns=PRINTER_COLUMNS, schema=openapi_schema())


def role_crd() -> dict[str, Any]:
    """InferencePoolRole's CustomResourceDefinition: its scale subresource is what HPA, KEDA and `kubectl scale`
    use."""
    scale = {"specReplicasPath": ".spec.replicas", "statusReplicasPath": ".status.replicas",
             "labelSelectorPath": ".status.selector"}
    schema = {
        "type": "object",
        "description": (role_scale.InferencePoolRole.__doc__ or "").strip(),
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string", "description": f"APIVersion of this object: {meta.API_VERSION}."},
            "kind": {"type": "string", "description": f"Kind of this object: {role_scale.KIND}."},
            "metadata": {"type": "object"},
            "spec": structural_schema(role_scale.InferencePoolRoleSpec),
            "status": structural_schema(role_scale.InferencePoolRoleStatus),
        },
    }
    return _definition(crd_name=role_scale.CRD_NAME, kind=role_scale.KIND, list_kind=role_scale.LIST_KIND,
                       plural=role_scale.PLURAL, singular=role_scale.SINGULAR, short_names=role_scale.SHORT_NAMES,
                       subresources={"status": {}, "scale": scale}, columns=ROLE_PRINTER_COLUMNS, schema=schema)


class _Dumper(yaml.SafeDumper):
    """Block style, no anchors, multi-line strings as literal blocks: stable and readable diffs."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def _text(definition: dict[str, Any]) -> str:
    return HEADER + yaml.dump(definition, Dumper=_Dumper, sort_keys=False, width=120, allow_unicode=True)


def render() -> str:
    """The InferencePool CRD file's full text."""
    return _text(crd())


def render_role() -> str:
    """The InferencePoolRole CRD file's full text."""
    return _text(role_crd())


def files(pool_output: Path) -> dict[Path, str]:
    """Every CRD file and its text; the InferencePoolRole file sits beside the InferencePool one."""
    return {pool_output: render(), pool_output.parent / f"{role_scale.CRD_NAME}.yaml": render_role()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT, help="where to write the CRD")
    parser.add_argument("--check", action="store_true", help="fail if the file differs instead of writing it")
    args = parser.parse_args(argv)
    wanted = files(args.output)
    if args.check:
        stale = [path for path, text in wanted.items() if (path.read_text() if path.exists() else "") != text]
        for path in stale:
            print(f"{path} is stale; regenerate it with: {REGENERATE}", file=sys.stderr)
        return 1 if stale else 0
    args.output.parent.mkdir(parents=True, exist_ok=True)
    for path, text in wanted.items():
        path.write_text(text)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
