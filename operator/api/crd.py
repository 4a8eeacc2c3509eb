"""Generates the InferencePool CustomResourceDefinition from the API models.

    python -m pdfleet.operator.api.crd            # rewrite crds/inferencepools.pdfleet.dev.yaml
    python -m pdfleet.operator.api.crd --check    # exit 1 if the committed file is stale

Run from the repository root. The output is deterministic (same models, same bytes), so the committed CRD can
be diffed against a fresh rendering; a unit test does exactly that.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

from pdfleet.operator.api import meta, names
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


def crd() -> dict[str, Any]:
    """The CustomResourceDefinition as a plain dict."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": meta.CRD_NAME},
        "spec": {
            "group": meta.GROUP,
            "names": {
                "kind": meta.KIND,
                "listKind": meta.LIST_KIND,
                "plural": meta.PLURAL,
                "singular": meta.SINGULAR,
                "shortNames": list(meta.SHORT_NAMES),
                "categories": list(meta.CATEGORIES),
            },
            "scope": "Namespaced",
            "versions": [{
                "name": meta.VERSION,
                "served": True,
                "storage": True,
                "subresources": {"status": {}},
                "additionalPrinterColumns": PRINTER_COLUMNS,
                "schema": {"openAPIV3Schema": openapi_schema()},
            }],
        },
    }


class _Dumper(yaml.SafeDumper):
    """Block style, no anchors, multi-line strings as literal blocks: stable and readable diffs."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def render() -> str:
    """The CRD file's full text."""
    return HEADER + yaml.dump(crd(), Dumper=_Dumper, sort_keys=False, width=120, allow_unicode=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT, help="where to write the CRD")
    parser.add_argument("--check", action="store_true", help="fail if the file differs instead of writing it")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        current = args.output.read_text() if args.output.exists() else ""
        if current != text:
            print(f"{args.output} is stale; regenerate it with: {REGENERATE}", file=sys.stderr)
            return 1
        return 0
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(text)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
