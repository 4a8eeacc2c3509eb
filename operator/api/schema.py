"""Pydantic JSON Schema -> a Kubernetes structural OpenAPI v3 schema.

The apiserver accepts only "structural" schemas: every node has a `type` (or is int-or-string, or preserves
unknown fields), there are no `$ref`s, and `anyOf`/`oneOf` may not introduce types. Pydantic emits `$defs` and
`$ref`, `anyOf [X, null]` for optional fields, titles, `propertyNames` and `additionalProperties: false`; this
module rewrites those into what the apiserver accepts, and nothing else: constraints, enums, defaults,
descriptions and the `x-kubernetes-*` extensions pass through unchanged.

Defaults: an optional sub-object whose Python default is a fresh model gets `default: {}`, so the apiserver
fills in its nested defaults exactly as pydantic does. Empty collections get no default at all: the apiserver
then stores nothing, and `ApiModel`'s serialiser omits them too, so both sides agree on the stored form.
"""

from __future__ import annotations

import copy
from typing import Any

from pydantic import BaseModel

Schema = dict[str, Any]

_DROP = ("title", "propertyNames", "$defs")
# Keys in the order a reader looks for them; anything else follows alphabetically.
_ORDER = ("description", "type", "format", "enum", "default", "minimum", "maximum", "minLength", "maxLength",
          "pattern", "minItems", "maxItems", "maxProperties", "x-kubernetes-int-or-string", "anyOf", "items",
          "properties", "additionalProperties", "required")


class NotStructural(ValueError):
    """The model uses a construct that has no structural-schema equivalent (a union of two models, say)."""


def structural_schema(model: type[BaseModel]) -> Schema:
    """The structural schema of `model`, with every `$ref` inlined."""
    raw = model.model_json_schema(by_alias=True, mode="validation")
    return _convert(raw, raw.get("$defs", {}), where=model.__name__)


def _resolve(node: Schema, defs: dict[str, Schema]) -> Schema:
    """Inlines a `$ref`; the referring node's own keys (its description, say) win over the target's."""
    if "$ref" not in node:
        return node
    target = copy.deepcopy(defs[node["$ref"].rsplit("/", 1)[-1]])
    return target | {key: value for key, value in node.items() if key != "$ref"}


def _collapse_optional(node: Schema, where: str) -> Schema:
    """`anyOf [X, {type: null}]` -> X merged with the node's own keys. int|str stays int-or-string."""
    if "anyOf" not in node:
        return node
    branches = [branch for branch in node["anyOf"] if branch.get("type") != "null"]
    if node.get("x-kubernetes-int-or-string") or {b.get("type") for b in branches} == {"integer", "string"}:
        rest = {key: value for key, value in node.items() if key != "anyOf"}
        return rest | {"anyOf": [{"type": "integer"}, {"type": "string"}], "x-kubernetes-int-or-string": True}
    if len(branches) != 1:
        raise NotStructural(f"{where}: a union of {len(branches)} types has no structural form")
    rest = {key: value for key, value in node.items() if key != "anyOf"}
    return branches[0] | rest


def _convert(node: Schema, defs: dict[str, Schema], where: str) -> Schema:
    node = _collapse_optional(_resolve(node, defs), where)
    if "anyOf" in node and not node.get("x-kubernetes-int-or-string"):
        raise NotStructural(f"{where}: anyOf outside int-or-string")
    if "$ref" in node:  # an optional reference: anyOf [$ref, null], converted whole (not twice: a second pass
        return _convert(node, defs, where)  # would take its optional sub-objects for defaulted ones)
    out: Schema = {}
    for key, value in node.items():
        if key in _DROP:
            continue
        if key == "default" and (value is None or value == [] or value == {}):
            continue
        if key == "additionalProperties" and value is False:
            continue  # the apiserver prunes unknown fields; `false` is not allowed next to `properties`
        if key == "additionalProperties" and value is True:
            continue  # free-form: expressed as x-kubernetes-preserve-unknown-fields
        if key == "properties":
            out[key] = _properties(value, set(node.get("required", ())), defs, where)
        elif key in ("items", "additionalProperties"):
            out[key] = _convert(value, defs, f"{where}[]")
        elif key == "patternProperties":
            (pattern_value,) = value.values()  # map keys are not validated by the apiserver; keep the values
            out["additionalProperties"] = _convert(pattern_value, defs, f"{where}{{}}")
        else:
            out[key] = value
    if "type" not in out and not out.get("x-kubernetes-int-or-string") and \
            not out.get("x-kubernetes-preserve-unknown-fields"):
        raise NotStructural(f"{where}: no type")
    return _ordered(out)


def _ordered(node: Schema) -> Schema:
    rank = {key: index for index, key in enumerate(_ORDER)}
    return {key: node[key] for key in sorted(node, key=lambda key: (rank.get(key, len(rank)), key))}


def _properties(props: dict[str, Schema], required: set[str], defs: dict[str, Schema], where: str) -> Schema:
    out = {}
    for name, prop in props.items():
        converted = _convert(prop, defs, f"{where}.{name}")
        is_model = converted.get("type") == "object" and "properties" in converted
        if is_model and name not in required and "default" not in prop and not _is_optional(prop):
            converted["default"] = {}
        out[name] = converted
    return out


def _is_optional(prop: Schema) -> bool:
    return any(branch.get("type") == "null" for branch in prop.get("anyOf", ()))
