"""The names of the two engine roles, in a module of their own: the role specs (api/roles.py) are made of the
scheduling models, and a role's placement (`scheduling.near`) names the other role, so both need the names."""

from __future__ import annotations

import enum


class Role(enum.StrEnum):
    """The two engine roles of a PD pool; the value is SGLang's --disaggregation-mode."""

    PREFILL = "prefill"
    DECODE = "decode"
