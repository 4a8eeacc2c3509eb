"""Puts SGLang's HTTP server back as it was after a test that installs pdfleet's refused routes (and its redacted
/server_info)."""

from __future__ import annotations

from types import ModuleType

import pytest

from pdfleet.runtime import refused_routes, server_info_redaction
from tests.support import requires


def restored_after(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """SGLang's HTTP server module; its route table and refused route functions return when the test ends."""
    requires.installed("sglang")
    module = requires.module(refused_routes.MODULE)
    monkeypatch.setattr(module.app.router, "routes", module.app.router.routes)
    for refusal in refused_routes.REFUSED:
        monkeypatch.setattr(module, refusal.function, getattr(module, refusal.function))
    for dotted in server_info_redaction.FINGERPRINTS["0.5.23"]:
        name = dotted.rsplit(".", 1)[1]
        monkeypatch.setattr(module, name, getattr(module, name))
    return module
