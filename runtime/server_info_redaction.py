"""Keys kept out of what an engine says about itself: `GET /server_info` (and its deprecated `/get_server_info`)
with SGLang's API keys redacted.

SGLang 0.5.23 answers `/server_info`, which needs no key, with its whole resolved configuration: `admin_api_key`
and `api_key` among the fields, and both again in `launch_command`, the command line as given. Anyone who could
reach an engine could read the admin key and use it, so setting one (`--admin-api-key` in
`spec.engine.extraArgs`) would lock nothing. Every pdfleet engine answers with those values replaced by
`<redacted>` (null stays null, so a reader still sees whether a key is set); everything else is SGLang's answer.

The module function `server_info` is replaced (`get_server_info` calls it by its module name), and the route of
`/server_info` in SGLang's app is given the replacement, as `refused_routes` replaces its routes: FastAPI built each
route's handler from the function at import. Verified like every patch target (SGLang version, fingerprints).
"""

from __future__ import annotations

import importlib
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from pdfleet.runtime.patches import base, targets

ID = "server-info-redaction"
MODULE = "sglang.srt.entrypoints.http_server"
PATH = "/server_info"
REDACTED = "<redacted>"
SECRET_FIELDS = ("admin_api_key", "api_key")
SECRET_FLAGS = ("--admin-api-key", "--api-key")

FINGERPRINTS: Mapping[str, Mapping[str, str]] = {
    "0.5.23": {
        f"{MODULE}.server_info": "92a39e0092df51a9",
        f"{MODULE}.get_server_info": "7a572929d1c32e14",  # calls `server_info` by its module name
    },
}


def redact(info: Mapping[str, Any]) -> dict[str, Any]:
    """`info` with every API key's value replaced, in its fields and in `launch_command`."""
    out = dict(info)
    for field in SECRET_FIELDS:
        if out.get(field) is not None:
            out[field] = REDACTED
    if isinstance(out.get("launch_command"), str):
        out["launch_command"] = redact_command_line(out["launch_command"])
    return out


def redact_command_line(command: str) -> str:
    """A command line with the value of each API-key flag replaced ('--api-key K' and '--api-key=K', and the
    abbreviations SGLang's parser takes, such as '--admin=K')."""
    words, out, hide_next = command.split(" "), [], False
    for word in words:
        if hide_next:
            out.append(REDACTED)
            hide_next = False
            continue
        name, eq, _ = word.partition("=")
        secret = len(name) > 2 and name.startswith("--") and any(flag.startswith(name) for flag in SECRET_FLAGS)
        if secret and eq:
            out.append(f"{name}={REDACTED}")
        else:
            out.append(word)
            hide_next = secret
    return " ".join(out)


def install(sglang_version: str) -> base.Applied:
    """Verifies the functions and the route, then replaces both; raises `base.PatchError` having replaced none."""
    fingerprints = FINGERPRINTS.get(sglang_version)
    if fingerprints is None:
        raise base.PatchError(f"{ID} was not checked against SGLang {sglang_version} "
                              f"(checked: {', '.join(sorted(FINGERPRINTS)) or 'none'})")
    try:
        found = {dotted: targets.verify(dotted, expected) for dotted, expected in fingerprints.items()}
        target = found[f"{MODULE}.server_info"]
        app = importlib.import_module(MODULE).app
        index = _route_index(app, target.function)
    except targets.TargetError as e:
        raise base.PatchError(f"{ID}: {e}") from None
    redacting = base.mark(_redacting(target.function), ID, target.function)
    routes = list(app.router.routes)
    route = routes[index]
    routes[index] = type(route)(route.path, redacting, methods=sorted(route.methods), name=route.name,
                                include_in_schema=route.include_in_schema)
    target.replace(redacting)
    app.router.routes = routes  # a new list, as refused_routes makes: SGLang's own is left as it was
    return base.Applied(id=ID, targets=tuple(fingerprints))


def _route_index(app: Any, function: Callable[..., Any]) -> int:
    from fastapi.routing import APIRoute

    found = [i for i, route in enumerate(app.router.routes) if getattr(route, "path", None) == PATH]
    if len(found) != 1:
        raise targets.TargetError(f"{MODULE}.app has {len(found)} routes for {PATH}, expected 1")
    route = app.router.routes[found[0]]
    if not isinstance(route, APIRoute) or route.endpoint is not function or route.methods != {"GET"}:
        raise targets.TargetError(f"{MODULE}.app's route {PATH} is not GET {MODULE}.server_info: SGLang changed "
                                  "how it serves it; check the redaction against it")
    return found[0]


def _redacting(original: Callable[[], Awaitable[Any]]) -> Callable[[], Awaitable[dict[str, Any]]]:
    async def server_info() -> dict[str, Any]:
        return redact(await original())

    server_info.__doc__ = original.__doc__
    if hasattr(original, "_auth_level"):  # SGLang's API-key middleware reads it from the route's endpoint
        server_info._auth_level = original._auth_level  # type: ignore[attr-defined]
    return server_info
