"""The base every API model derives from, and `Rule`: one cross-field rule stated once for two enforcers.

A `Rule` carries a CEL expression (for the apiserver, emitted into the CRD as `x-kubernetes-validations`) and a
Python predicate (for the operator, run by pydantic) side by side, with one message. Keeping them in one
object is what makes "the apiserver and the operator accept the same specs" reviewable: a rule cannot be added
to one side without being written for the other, and the unit and integration tests run the same table of
invalid specs against both.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, ClassVar, Self

from pydantic import BaseModel, ConfigDict, model_serializer, model_validator
from pydantic.alias_generators import to_camel
from pydantic_core import PydanticCustomError

RULE_ERROR = "pdfleet_rule"


@dataclasses.dataclass(frozen=True)
class Rule:
    """A validation rule of one object, enforced by the apiserver (`cel`) and by Python (`holds`).

    `field` is the offending field relative to the object (a CEL `fieldPath` such as `.tp`); the apiserver
    reports the error at that path and Python reports it as the problem's path. `message` names the fields
    involved, so it reads well on its own in a Condition. `cel` is None only where the schema itself already
    makes the apiserver enforce the rule (a list-type set or map refuses duplicates).
    """

    cel: str | None
    holds: Callable[[Any], bool]
    message: str
    field: str | None = None
    reason: str | None = None
    message_expression: str | None = None  # CEL building a more specific message; `message` is the fallback

    def to_crd(self) -> dict[str, str]:
        assert self.cel is not None, "a schema-enforced rule has no CEL form"
        out = {"rule": self.cel, "message": self.message}
        if self.field:
            out["fieldPath"] = self.field
        if self.reason:
            out["reason"] = self.reason
        if self.message_expression:
            out["messageExpression"] = self.message_expression
        return out

    def error(self) -> PydanticCustomError:
        return PydanticCustomError(RULE_ERROR, self.message, {"field": self.field or ""})


def _schema_extra(schema: dict[str, Any], cls: type[BaseModel]) -> None:
    """Puts a model's rules into its JSON schema, where the CRD generator picks them up."""
    schema.pop("title", None)
    rules = getattr(cls, "RULES", ())
    if rules:
        cel = [rule.to_crd() for rule in rules if rule.cel is not None]
        if cel:
            schema["x-kubernetes-validations"] = cel


class ApiModel(BaseModel):
    """Frozen, strict about unknown fields, camelCase on the wire, snake_case in Python.

    Serialising (`model_dump(mode="json")`) gives the wire form the apiserver would store: aliases, no None,
    and no empty collection the user never set (the CRD gives collections no default, so the apiserver stores
    none either; the operator's typed view still sees `()`/`{}` instead of None).
    """

    model_config = ConfigDict(
        frozen=True,
        extra="forbid",
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
        use_enum_values=False,
        json_schema_extra=_schema_extra,
    )

    RULES: ClassVar[tuple[Rule, ...]] = ()

    @model_validator(mode="after")
    def _check_rules(self) -> Self:
        # The first broken rule of an object is reported (the apiserver reports all of them): pydantic takes
        # one error per validator, and a second rule on an object already known to be wrong rarely helps.
        for rule in type(self).RULES:
            if not rule.holds(self):
                raise rule.error()
        return self

    @model_serializer(mode="wrap")
    def _wire(self, handler: Callable[[Any], dict[str, Any]]) -> dict[str, Any]:
        data = handler(self)
        for name, field in type(self).model_fields.items():
            key = field.alias or name
            if key not in data:
                continue
            value = data[key]
            if value is None or (value in ([], {}, ()) and field.get_default(call_default_factory=True) in
                                 ((), [], {}, None)):
                del data[key]
        return data
