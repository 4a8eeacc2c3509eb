"""The operator's side of the engine flag table (`pdfleet.runtime.engine_flags`, the one table of SGLang flags and
environment variables the operator owns or refuses): the CEL literal admission checks `extraArgs` and `env` with, and
the fields the serverArgs gate compares.
"""

from __future__ import annotations

from pdfleet.runtime.engine_flags import (
    ALIAS,
    FLAGS,
    MANAGED_FLAGS,
    NO_FLEXKV,
    NO_GRPC,
    NO_LORA,
    NO_PP,
    NO_ROLE_SWITCH,
    REFUSED_ENV,
    TOKEN_AGREEMENT_ENV,
    ManagedFlag,
    option_name,
    reserved_flag,
)

__all__ = ["ALIAS", "FLAGS", "MANAGED_FLAGS", "NO_FLEXKV", "NO_GRPC", "NO_LORA", "NO_PP",
           "NO_ROLE_SWITCH", "REFUSED_ENV", "TOKEN_AGREEMENT_ENV", "ManagedFlag", "cel_list", "option_name",
           "reserved_flag", "server_args_fields"]


def server_args_fields() -> dict[str, tuple[str, type]]:
    """Flag -> (ServerArgs field, type) of every flag the serverArgs gate compares."""
    return {name: (flag.field, flag.kind) for name, flag in FLAGS.items() if flag.field is not None}


def cel_list(flags: dict[str, str] = MANAGED_FLAGS) -> str:
    """The managed flags as a CEL list literal."""
    return "[" + ", ".join(f"'{flag}'" for flag in flags) + "]"
