"""Finding a patch's target functions in the installed SGLang and checking they are what the patch expects.

A patch replaces exact functions. Before it does, each target is resolved from its dotted name and
fingerprinted: a hash of its dedented source and its signature. SGLang moves fast (see docs/architecture.md on its
scheduler), so a target whose fingerprint differs from the one the patch was written against is refused
instead of patched: a patch silently applied to code it was not written for is how a fix becomes a bug.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import inspect
import textwrap
from collections.abc import Callable
from typing import Any


class TargetError(Exception):
    """A target that cannot be found, or is not what the patch was written for."""


@dataclasses.dataclass(frozen=True)
class Target:
    """A resolved target: the object that holds the function, the attribute name, and the function."""

    dotted: str
    owner: Any
    attr: str
    function: Callable[..., Any]
    is_property: bool = False  # the target is a property's getter: the replacement is installed as one

    def replace(self, new: Callable[..., Any]) -> None:
        setattr(self.owner, self.attr, property(new) if self.is_property else new)


def resolve(dotted: str) -> Target:
    """'pkg.module.Class.method' -> Target, importing the longest importable module prefix."""
    parts = dotted.split(".")
    for split in range(len(parts) - 1, 0, -1):
        module_name = ".".join(parts[:split])
        try:
            owner: Any = importlib.import_module(module_name)
        except ModuleNotFoundError as e:
            if e.name and module_name.startswith(e.name):
                continue  # this prefix is not a module; try a shorter one
            raise TargetError(f"{dotted}: importing {module_name} failed: {e}") from e
        attrs = parts[split:]
        try:
            for name in attrs[:-1]:
                owner = getattr(owner, name)
            function = inspect.getattr_static(owner, attrs[-1])
        except AttributeError:
            raise TargetError(f"{dotted}: {module_name} has no {'.'.join(attrs)}") from None
        if isinstance(function, staticmethod | classmethod):
            function = function.__func__
        is_property = isinstance(function, property) and function.fset is None
        if is_property:
            function = function.fget
        if not callable(function):
            raise TargetError(f"{dotted} is not a function")
        return Target(dotted=dotted, owner=owner, attr=attrs[-1], function=function, is_property=is_property)
    raise TargetError(f"{dotted}: no importable module in this name")


def fingerprint(function: Callable[..., Any]) -> str:
    """sha256 over the function's signature and dedented source, first 16 hex digits."""
    original = inspect.unwrap(function)
    try:
        source = textwrap.dedent(inspect.getsource(original))
    except (OSError, TypeError) as e:
        raise TargetError(f"{getattr(original, '__qualname__', original)}: no source to check ({e})") from None
    signature = str(inspect.signature(original))
    return hashlib.sha256(f"{signature}\n{source}".encode()).hexdigest()[:16]


def verify(dotted: str, expected: str) -> Target:
    target = resolve(dotted)
    if getattr(target.function, "__pdfleet_patch__", None):
        raise TargetError(f"{dotted} is already patched by {target.function.__pdfleet_patch__}")
    actual = fingerprint(target.function)
    if actual != expected:
        raise TargetError(
            f"{dotted} is not the function this patch was written for (fingerprint {actual}, expected "
            f"{expected}): SGLang changed it. Check whether upstream fixed the issue, then update the patch."
        )
    return target
