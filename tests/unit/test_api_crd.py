"""The generated CRD: fresh, structural, deterministic, and consistent with the models it comes from."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from pdfleet.operator.api import crd, meta
from pdfleet.runtime.patches import catalogue

ROOT = Path(__file__).resolve().parents[2]
CRD_FILE = ROOT / crd.DEFAULT_OUTPUT


def _schema() -> dict[str, Any]:
    return crd.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def _nodes(node: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    yield path, node
    for name, prop in node.get("properties", {}).items():
        yield from _nodes(prop, f"{path}.{name}")
    if isinstance(node.get("items"), dict):
        yield from _nodes(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from _nodes(node["additionalProperties"], f"{path}{{}}")


def test_the_committed_crd_matches_the_models() -> None:
    committed = CRD_FILE.read_text() if CRD_FILE.exists() else ""
    assert committed == crd.render(), f"{crd.DEFAULT_OUTPUT} is stale; regenerate it with: {crd.REGENERATE}"


def test_rendering_twice_gives_the_same_bytes() -> None:
    assert crd.render() == crd.render()


def test_the_crd_uses_our_own_group_and_names() -> None:
    spec = crd.crd()["spec"]
    assert spec["group"] == "pdfleet.dev" != "inference.networking.k8s.io"
    assert spec["names"]["kind"] == "InferencePool"
    assert spec["names"]["plural"] == "inferencepools"
    assert spec["names"]["shortNames"] == ["pdpool"]
    assert spec["versions"][0]["name"] == "v1alpha1"
    assert spec["versions"][0]["subresources"] == {"status": {}}
    assert crd.crd()["metadata"]["name"] == meta.CRD_NAME == "inferencepools.pdfleet.dev"


def test_every_schema_node_is_structural() -> None:
    for path, node in _nodes(_schema()):
        for forbidden in ("$ref", "$defs", "oneOf", "allOf", "title", "propertyNames", "patternProperties"):
            assert forbidden not in node, f"{path}: {forbidden}"
        if "anyOf" in node:
            assert node.get("x-kubernetes-int-or-string") is True, f"{path}: anyOf outside int-or-string"
            assert node["anyOf"] == [{"type": "integer"}, {"type": "string"}], path
        else:
            assert "type" in node or node.get("x-kubernetes-preserve-unknown-fields"), f"{path}: no type"


def test_every_field_of_spec_and_status_has_a_description() -> None:
    for section in ("spec", "status"):
        for path, node in _nodes(_schema()["properties"][section], section):
            for name, prop in node.get("properties", {}).items():
                assert prop.get("description"), f"{path}.{name} has no description"


def test_every_string_has_a_max_length_so_cel_costs_are_bounded() -> None:
    for path, node in _nodes(_schema()["properties"]["spec"], "spec"):
        if node.get("type") == "string" and "enum" not in node:
            assert "maxLength" in node, f"{path}: string without maxLength"
        if node.get("type") == "array":
            assert "maxItems" in node, f"{path}: array without maxItems"


def test_defaults_reach_nested_fields_of_omitted_sections() -> None:
    spec = _schema()["properties"]["spec"]
    assert spec["required"] == ["model", "engine", "prefill", "decode"]
    for section in ("router", "transfer", "health", "rollout"):
        assert spec["properties"][section]["default"] == {}, section
    assert spec["properties"]["health"]["properties"]["hangAfter"]["default"] == "10m"


def test_empty_collections_have_no_default() -> None:
    engine = _schema()["properties"]["spec"]["properties"]["engine"]["properties"]
    for name in ("patches", "extraArgs", "env"):
        assert "default" not in engine[name], name


def test_a_defaulted_object_can_be_built_from_its_own_defaults() -> None:
    """`default: {}` on an object with required fields is refused by the apiserver (and would be a lie): an
    optional sub-object, however deep under other optional ones, gets no default."""
    for path, node in _nodes(_schema()):
        if node.get("default") == {}:
            assert not node.get("required"), f"{path} defaults to {{}} but requires {node['required']}"


def test_patch_ids_are_the_runtime_catalogue() -> None:
    engine = _schema()["properties"]["spec"]["properties"]["engine"]["properties"]
    assert engine["patches"]["items"]["enum"] == sorted(catalogue.IDS)
    assert engine["patches"]["x-kubernetes-list-type"] == "set"


def test_cel_field_paths_point_at_existing_fields() -> None:
    for path, node in _nodes(_schema()):
        for rule in node.get("x-kubernetes-validations", ()):
            assert rule["message"], f"{path}: rule without message"
            target = node
            for part in rule.get("fieldPath", "").split(".")[1:]:
                assert part in target.get("properties", {}), f"{path}: fieldPath {rule['fieldPath']} is not a field"
                target = target["properties"][part]


def test_printer_columns_read_fields_of_the_schema() -> None:
    columns = crd.crd()["spec"]["versions"][0]["additionalPrinterColumns"]
    assert [c["name"] for c in columns][:4] == ["Phase", "Prefill", "Decode", "Revision"]
    assert columns[-1]["name"] == "Age"
    for column in columns:
        node = _schema()
        # A filter (`conditions[?(@.type=="X")]`) picks items of a list: walk into the items' schema.
        path = re.sub(r"\[\?\(@\.type==\"\w+\"\)\]", "[]", column["jsonPath"])
        for part in path.split(".")[1:]:
            if part == "creationTimestamp":
                break
            node = node["properties"][part.removesuffix("[]")]
            if part.endswith("[]"):
                assert node["type"] == "array", column["name"]
                assert "type" in node["items"]["properties"], column["name"]
                node = node["items"]
        else:
            assert node["type"] == column["type"], column["name"]


def test_the_crd_file_is_plain_yaml_that_round_trips() -> None:
    assert yaml.safe_load(crd.render()) == crd.crd()


def test_check_mode_fails_on_a_stale_file_and_says_how_to_regenerate(tmp_path: Path, capsys: Any) -> None:
    stale = tmp_path / "crd.yaml"
    stale.write_text("stale\n")
    assert crd.main(["--check", "--output", str(stale)]) == 1
    assert crd.REGENERATE in capsys.readouterr().err
    assert crd.main(["--output", str(stale)]) == 0
    assert crd.main(["--check", "--output", str(stale)]) == 0
