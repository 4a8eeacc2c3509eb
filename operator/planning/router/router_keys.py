"""The router's control-plane key: which keys the pool's Secret holds, which one new router pods get, and when
one is rotated. Pure; `render.router_secret` writes the Secret out, `kube.router_key_secrets` reads and applies it.

sglang-router takes its control-plane keys on its command line only, read once at start, so a rotation is a
rolling restart of the router Deployment. To keep every router pod reachable by the operator throughout, keys
are named (`key-1`, `key-2`, ...) and a router pod refers to exactly one by name (`secretKeyRef.key`): the
operator calls each pod with the key that pod started with, and the Secret keeps a key while any router pod
still refers to it. Two keys are valid at once only while a rotation rolls; a name never changes its value.

A rotation is asked for by setting the pool annotation `pdfleet.dev/rotate-router-key` to a new value (any
string, a timestamp say). The Secret records the last value it acted on.
"""

from __future__ import annotations

import base64
import dataclasses
import re
from collections.abc import Callable, Collection, Mapping
from typing import Any

from pdfleet.operator.render import labels
from pdfleet.operator.render.router_secret import CURRENT_ANNOTATION, HANDLED_ANNOTATION

ROTATE_ANNOTATION = f"{labels.PREFIX}/rotate-router-key"
_NAME = re.compile(r"^key-([1-9][0-9]*)$")


def key_name(generation: int) -> str:
    return f"key-{generation}"


def generation(name: str) -> int:
    m = _NAME.match(name)
    return int(m.group(1)) if m else 0


@dataclasses.dataclass(frozen=True)
class KeySet:
    """What the Secret holds (or should): key values by name, never shown in a repr or a log line."""

    current: str
    keys: Mapping[str, str] = dataclasses.field(repr=False)
    handled: str = ""
    # The highest key number ever named here, data or annotation: a new key is numbered above it.
    highest: int = dataclasses.field(default=0, compare=False)

    def next_name(self, in_use: Collection[str] = ()) -> str:
        """A name above every one this set or a router pod (`in_use`) has held."""
        return key_name(max(self.highest, generation(self.current), *map(generation, [*self.keys, *in_use])) + 1)

    def value(self, name: str | None) -> str | None:
        return self.keys.get(name) if name else None


def recovered(read: KeySet | None, remembered: KeySet | None, referenced: Collection[str]) -> KeySet | None:
    """The Secret as read, with the keys router pods still use put back from what the operator remembers (a
    Secret deleted or edited by hand), and numbering that continues from the highest name it knew."""
    if remembered is None:
        return read
    highest = max(remembered.highest, generation(remembered.current), *map(generation, remembered.keys))
    lost = {n: v for n, v in remembered.keys.items() if n in referenced and (read is None or n not in read.keys)}
    if read is None:
        return KeySet(current="", keys=lost, highest=highest)
    return dataclasses.replace(read, keys={**lost, **read.keys}, highest=max(read.highest, highest))


def parse(secret: Mapping[str, Any] | None) -> KeySet | None:
    """The Secret as a KeySet (current "" when its current key is unusable); None when it holds no key."""
    if not secret:
        return None
    annotations = secret.get("metadata", {}).get("annotations") or {}
    keys: dict[str, str] = {}
    for name, encoded in (secret.get("data") or {}).items():
        try:
            value = base64.b64decode(encoded, validate=True).decode()
        except (ValueError, TypeError):
            continue
        if generation(name) and value:
            keys[name] = value
    if not keys:
        return None
    current = str(annotations.get(CURRENT_ANNOTATION, ""))
    # A current key missing from the data (edited by hand) is not reused: `decide` makes a new one.
    return KeySet(current=current if current in keys else "", keys=keys,
                  handled=str(annotations.get(HANDLED_ANNOTATION, "")), highest=generation(current))


def decide(current: KeySet | None, *, rotate: str, referenced: Collection[str],
           new_key: Callable[[], str]) -> tuple[KeySet, bool]:
    """The key set the Secret should hold, and whether a new key was made for a rotation.

    A key is kept while it is current or a router pod refers to it; a new one is made when there is none
    usable or the pool asks for a rotation it has not had. A new key always gets a name never used before, by
    the Secret or by a router pod, so a pod's key name never comes to mean another value.
    """
    if current is None or not current.current:
        known = current if current is not None else KeySet(current="", keys={})
        name = known.next_name(referenced)
        keys = {n: v for n, v in known.keys.items() if n in referenced}
        return KeySet(current=name, keys={**keys, name: new_key()}, handled=rotate), False
    keys = dict(current.keys)
    rotated = bool(rotate) and rotate != current.handled
    name = current.current
    if rotated:
        name = current.next_name(referenced)
        keys[name] = new_key()
    kept = {n: v for n, v in keys.items() if n == name or n in referenced}
    return KeySet(current=name, keys=kept, handled=rotate if rotated else current.handled), rotated
