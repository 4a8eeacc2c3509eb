"""SGLang's API keys kept out of `GET /server_info` (runtime/server_info_redaction.py): SGLang 0.5.23's own app
answers with the admin key in two places; with the redaction installed it answers `<redacted>` there and the rest
as before. The engine simulator answers the same, through the launcher, with the key on its command line."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest

from pdfleet.runtime import server_info_redaction as redaction
from pdfleet.runtime.patches import base
from tests.support import refused_sglang_routes, requires, sim_engine

VERSION = "0.5.23"
KEYS = ["--admin-api-key", "an-admin-key", "--api-key=a-client-key"]


@pytest.mark.parametrize(("command", "redacted"), [
    ("--model-path /m --admin-api-key K --port 1", "--model-path /m --admin-api-key <redacted> --port 1"),
    ("--api-key=K --admin=K2", "--api-key=<redacted> --admin=<redacted>"),
    ("--api-key", "--api-key"),  # nothing follows: nothing to hide
    ("--model-path /m --apiserver x", "--model-path /m --apiserver x"),  # not a prefix of a key flag
])
def test_the_command_line_keeps_everything_but_the_keys(command: str, redacted: str) -> None:
    assert redaction.redact_command_line(command) == redacted


class StandIn:
    """What SGLang's /server_info handler asks of the tokenizer manager."""

    def __init__(self, server_args: Any) -> None:
        self.server_args = server_args
        self.startup_time = 1.0

    async def get_internal_state(self) -> list[dict[str, Any]]:
        return [{"last_gen_throughput": 0.0}]


@pytest.fixture
def http_server(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    return refused_sglang_routes.restored_after(monkeypatch)


def test_sglangs_own_server_info_shows_the_keys_and_the_redacted_one_does_not(
        http_server: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    from fastapi.testclient import TestClient
    from sglang.srt.server_args import prepare_server_args

    args = prepare_server_args(["--model-path", "/m", *KEYS])
    monkeypatch.setattr(http_server, "_global_state",
                        http_server._GlobalState(tokenizer_manager=StandIn(args), template_manager=None,
                                                 scheduler_info={}))
    client = TestClient(http_server.app)  # its lifespan not run: it would start the engine
    try:
        before = client.get("/server_info").json()
        assert (before["admin_api_key"], before["api_key"]) == ("an-admin-key", "a-client-key"), \
            "SGLang answers with the keys"
        assert "an-admin-key" in before["launch_command"]
        applied = redaction.install(VERSION)
        assert applied.id == redaction.ID
        for path in ("/server_info", "/get_server_info"):
            after = client.get(path).json()
            assert (after["admin_api_key"], after["api_key"]) == (redaction.REDACTED, redaction.REDACTED), path
            assert after["launch_command"] == "--model-path /m --admin-api-key <redacted> --api-key=<redacted>"
            assert {k: v for k, v in after.items() if k not in ("admin_api_key", "api_key", "launch_command")} == \
                {k: v for k, v in before.items() if k not in ("admin_api_key", "api_key", "launch_command")}
        with pytest.raises(base.PatchError, match="already patched"):
            redaction.install(VERSION)
    finally:
        client.close()


def test_a_changed_server_info_stops_the_install_and_replaces_nothing(
        http_server: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    routes = list(http_server.app.router.routes)
    monkeypatch.setattr(http_server.app.router, "routes", [
        r for r in routes if getattr(r, "path", None) != redaction.PATH])
    with pytest.raises(base.PatchError, match="has 0 routes for /server_info"):
        redaction.install(VERSION)
    assert not hasattr(http_server.server_info, "__pdfleet_patch__")
    with pytest.raises(base.PatchError, match=r"was not checked against SGLang 0\.6\.1"):
        redaction.install("0.6.1")


def test_the_engine_simulator_answers_with_the_keys_redacted(tmp_path: Path) -> None:
    requires.installed("sglang")
    with sim_engine.serving({"null": sim_engine.start(tmp_path, "null", tp=1, extra=KEYS)}) as engines:
        info = httpx.get(engines["null"].url + "/server_info", timeout=30).json()
    assert (info["admin_api_key"], info["api_key"]) == (redaction.REDACTED, redaction.REDACTED)
    assert "an-admin-key" not in info["launch_command"] and "a-client-key" not in info["launch_command"]
