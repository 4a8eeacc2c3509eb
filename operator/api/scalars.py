"""Constrained scalar types shared by the API: durations, ports, names, quantities.

Each is an `Annotated` type whose constraints pydantic enforces in Python and the CRD generator turns into
OpenAPI (`pattern`, `minimum`, `maxLength`, ...), so both sides check the same thing. Every string carries a
`maxLength`: the apiserver's CEL cost estimator needs it to accept rules that read the string.
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Annotated

from pydantic import AfterValidator, Field, WithJsonSchema
from pydantic_core import PydanticCustomError

# A Go duration restricted to integers and the units an operator timeout needs ("30s", "5m", "1h30m"): the
# same text parses with CEL's duration(), Go's time.ParseDuration and `parse_duration` below.
DURATION_PATTERN = r"^([0-9]{1,9}(ms|s|m|h))+$"
_DURATION_PART = re.compile(r"([0-9]+)(ms|s|m|h)")
_UNIT = {"ms": timedelta(milliseconds=1), "s": timedelta(seconds=1), "m": timedelta(minutes=1),
         "h": timedelta(hours=1)}


def parse_duration(text: str) -> timedelta:
    """'1h30m' -> timedelta(hours=1, minutes=30). Raises ValueError on text outside DURATION_PATTERN."""
    if not re.fullmatch(DURATION_PATTERN, text):
        raise ValueError(f"not a duration: {text!r} (expected e.g. 30s, 5m, 1h30m)")
    return sum((int(n) * _UNIT[unit] for n, unit in _DURATION_PART.findall(text)), timedelta())


def _positive(text: str) -> str:
    if parse_duration(text) <= timedelta():
        raise PydanticCustomError("pdfleet_rule", "must be a positive duration such as 30s or 5m", {"field": ""})
    return text


Duration = Annotated[
    str,
    Field(
        pattern=DURATION_PATTERN,
        max_length=32,
        json_schema_extra={
            "x-kubernetes-validations": [
                {"rule": f"!self.matches('{DURATION_PATTERN}') || duration(self) > duration('0s')",
                 "message": "must be a positive duration such as 30s"}
            ]
        },
    ),
    AfterValidator(_positive),
]

# A duration that may be zero ("0s": the thing it times is switched off).
DurationOrZero = Annotated[str, Field(pattern=DURATION_PATTERN, max_length=32)]

Port = Annotated[int, Field(ge=1, le=65535)]

# An RFC 1123 label-ish name: container env names, parser names and the like stay short and plain.
DNS_SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
DnsSubdomain = Annotated[str, Field(pattern=DNS_SUBDOMAIN_PATTERN, min_length=1, max_length=253)]

# Kubernetes resource.Quantity, as the core API spells it: an integer or a string like "64Gi" or "500m".
QUANTITY_PATTERN = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)


def _quantity(value: int | str) -> int | str:
    if isinstance(value, str) and (len(value) > 64 or not re.fullmatch(QUANTITY_PATTERN, value)):
        raise PydanticCustomError("pdfleet_rule", "not a quantity such as 16, 500m or 64Gi", {"field": ""})
    return value


# One validator for both forms, so a bad value gives one error, not one per union member.
Quantity = Annotated[
    int | str,
    AfterValidator(_quantity),
    WithJsonSchema({"anyOf": [{"type": "integer"}, {"type": "string"}], "pattern": QUANTITY_PATTERN,
                    "x-kubernetes-int-or-string": True}),
]

ImageRef = Annotated[str, Field(min_length=1, max_length=512, pattern=r"^\S+$")]
AbsolutePath = Annotated[str, Field(min_length=1, max_length=4096, pattern=r"^/")]
