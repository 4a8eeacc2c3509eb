"""SGLang 0.5.23's own FastAPI app, served in process: unpatched, POST /update_weights_from_disk (and from
tensor, distributed and IPC) and /add_external_corpus reach the tokenizer manager's weight update and corpus
calls; with pdfleet's refused routes installed (`pdfleet.runtime.refused_routes`) they answer 403 with the reason
and nothing reaches it, whatever the body, while other routes answer as before. A changed or moved target stops
the install, which changes nothing.

The tokenizer manager is a stand-in that records what reaches it (no model loads here); the app, its route
table, its middleware and its handlers are SGLang's."""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

from pdfleet.runtime import launcher, refused_routes
from pdfleet.runtime.patches import base, targets
from tests.support import refused_sglang_routes, requires

VERSION = "0.5.23"
WEIGHTS = {"model_path": "/models/next", "abort_all_requests": True}
CORPUS = {"corpus_id": "docs", "documents": ["a corpus the ranks would install one by one"]}


class TokenizerManagerStandIn:
    """Answers what SGLang's handlers ask of the tokenizer manager, and records each call that would go on to the
    scheduler ranks."""

    def __init__(self, io: ModuleType, server_status: Any) -> None:
        self.io = io
        self.calls: list[tuple[str, Any]] = []
        self.gracefully_exit = False
        self.initial_weights_loaded = True  # read by SGLang's IPC weight-update handler
        self.server_status = server_status

    async def update_weights_from_disk(self, obj: Any, request: Any) -> tuple[bool, str, int]:
        self.calls.append(("update_weights_from_disk", obj))
        return True, "weights updated", 0

    async def update_weights_from_tensor(self, obj: Any, request: Any) -> tuple[bool, str]:
        self.calls.append(("update_weights_from_tensor", obj))
        return True, "weights updated"

    async def update_weights_from_distributed(self, obj: Any, request: Any) -> tuple[bool, str]:
        self.calls.append(("update_weights_from_distributed", obj))
        return True, "weights updated"

    async def update_weights_from_ipc(self, obj: Any, request: Any) -> tuple[bool, str]:
        self.calls.append(("update_weights_from_ipc", obj))
        return True, "weights updated"

    async def add_external_corpus(self, obj: Any) -> Any:
        self.calls.append(("add_external_corpus", obj))
        return self.io.AddExternalCorpusReqOutput(success=True, corpus_id=obj.corpus_id, loaded_token_count=7)

    async def init_weights_update_group(self, obj: Any, request: Any) -> tuple[bool, str]:
        self.calls.append(("init_weights_update_group", obj))
        return True, "group ready"

    async def init_weights_send_group_for_remote_instance(self, obj: Any, request: Any) -> tuple[bool, str]:
        self.calls.append(("init_weights_send_group_for_remote_instance", obj))
        return True, "group ready"

    async def send_weights_to_remote_instance(self, obj: Any, request: Any) -> tuple[bool, str]:
        self.calls.append(("send_weights_to_remote_instance", obj))
        return True, "weights sent"

    async def release_memory_occupation(self, obj: Any, request: Any) -> None:
        self.calls.append(("release_memory_occupation", obj))

    async def resume_memory_occupation(self, obj: Any, request: Any) -> None:
        self.calls.append(("resume_memory_occupation", obj))

    def is_ready(self) -> bool:
        return True

    async def flush_cache(self, timeout_s: float) -> Any:
        self.calls.append(("flush_cache", timeout_s))
        return self.io.FlushCacheReqOutput(success=True)


@pytest.fixture
def http_server(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    return refused_sglang_routes.restored_after(monkeypatch)


@pytest.fixture
def served(http_server: ModuleType, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Any, TokenizerManagerStandIn]]:
    """A client of SGLang's real app (lifespan not run: it would start the engine) and the stand-in behind it."""
    from fastapi.testclient import TestClient

    io = requires.module("sglang.srt.managers.io_struct")
    status = requires.module("sglang.srt.managers.tokenizer_manager").ServerStatus.Up
    standin = TokenizerManagerStandIn(io, status)
    monkeypatch.setattr(http_server, "_global_state",
                        http_server._GlobalState(tokenizer_manager=standin, template_manager=None, scheduler_info={}))
    client = TestClient(http_server.app)
    yield client, standin
    client.close()


def test_unpatched_both_requests_reach_the_tokenizer_manager(served: tuple[Any, TokenizerManagerStandIn]) -> None:
    client, standin = served
    weights = client.post("/update_weights_from_disk", json=WEIGHTS)
    corpus = client.post("/add_external_corpus", json=CORPUS)
    assert (weights.status_code, weights.json()["success"]) == (200, True)
    assert (corpus.status_code, corpus.json()["loaded_token_count"]) == (200, 7)
    assert [name for name, _ in standin.calls] == ["update_weights_from_disk", "add_external_corpus"]
    assert standin.calls[0][1].model_path == "/models/next"
    assert standin.calls[1][1].documents == CORPUS["documents"]


# The other weight updates' bodies, as SGLang's request models take them (their handlers need no more to run).
OTHER_WEIGHTS = {
    "/update_weights_from_tensor": {"serialized_named_tensors": ["e30="]},
    "/update_weights_from_distributed": {"names": ["w"], "dtypes": ["bfloat16"], "shapes": [[1]]},
    "/update_weights_from_ipc": {"zmq_handles": {}},
}


def test_unpatched_the_other_weight_updates_reach_the_tokenizer_manager(
        served: tuple[Any, TokenizerManagerStandIn]) -> None:
    client, standin = served
    answers = {path: client.post(path, json=body) for path, body in OTHER_WEIGHTS.items()}
    assert {p: (a.status_code, a.json()["success"]) for p, a in answers.items()} == \
        {p: (200, True) for p in OTHER_WEIGHTS}
    assert [name for name, _ in standin.calls] == [p.lstrip("/") for p in OTHER_WEIGHTS]


# The weight process groups' and memory release's bodies, as SGLang's request models take them.
GROUP = {"master_address": "127.0.0.1", "group_name": "weights", "backend": "gloo", "world_size": 2}
WEIGHT_GROUPS_AND_MEMORY = {
    "/init_weights_update_group": GROUP | {"master_port": 29500, "rank_offset": 1},
    "/init_weights_send_group_for_remote_instance": GROUP | {"ports": "29500", "group_rank": 0},
    "/send_weights_to_remote_instance": {"master_address": "127.0.0.1", "ports": "29500", "group_name": "weights"},
    "/release_memory_occupation": {},
    "/resume_memory_occupation": {},
}


def test_unpatched_the_weight_group_and_memory_requests_reach_the_tokenizer_manager(
        served: tuple[Any, TokenizerManagerStandIn]) -> None:
    client, standin = served
    answers = {path: client.post(path, json=body) for path, body in WEIGHT_GROUPS_AND_MEMORY.items()}
    assert {p: a.status_code for p, a in answers.items()} == dict.fromkeys(WEIGHT_GROUPS_AND_MEMORY, 200)
    assert client.request("GET", "/release_memory_occupation", json={}).status_code == 200, "and for GET"
    assert [name for name, _ in standin.calls] == [p.lstrip("/") for p in WEIGHT_GROUPS_AND_MEMORY] + [
        "release_memory_occupation"]


def test_refused_every_route_answers_403_with_the_reason_and_nothing_reaches_the_tokenizer_manager(
        served: tuple[Any, TokenizerManagerStandIn]) -> None:
    client, standin = served
    applied = refused_routes.install(VERSION)
    assert applied.targets == tuple(f"{refused_routes.MODULE}.{name}" for name in (
        "update_weights_from_disk", "update_weights_from_tensor", "update_weights_from_distributed",
        "update_weights_from_ipc", "add_external_corpus", "init_weights_update_group",
        "init_weights_send_group_for_remote_instance", "send_weights_to_remote_instance",
        "release_memory_occupation", "resume_memory_occupation", "attach_hicache_storage_backend",
        "detach_hicache_storage_backend"))
    for path, body in WEIGHT_GROUPS_AND_MEMORY.items():
        answer = client.post(path, json=body)
        assert answer.status_code == 403 and answer.json()["message"].startswith("refused by pdfleet: "), path
    for path in ("/release_memory_occupation", "/resume_memory_occupation"):
        answer = client.get(path)
        assert answer.status_code == 403 and "asserts on its own that it is idle" in answer.json()["message"]
    assert "goes on while its peers wait" in client.post("/init_weights_update_group", json={}).json()["message"]
    for path, body in OTHER_WEIGHTS.items():
        answer = client.post(path, json=body)
        assert answer.status_code == 403 and "roll out spec.model instead" in answer.json()["message"], path
    weights = client.post("/update_weights_from_disk", json=WEIGHTS)
    corpus = client.post("/add_external_corpus", json=CORPUS)
    # A body SGLang's own handler would reject is refused the same way: nothing of it is read.
    malformed = client.post("/update_weights_from_disk", content=b"not json")
    for answer in (weights, malformed):
        assert answer.status_code == 403
        assert answer.json()["success"] is False
        assert answer.json()["message"].startswith("refused by pdfleet: ")
        assert "roll out spec.model instead" in answer.json()["message"]
    assert corpus.status_code == 403
    assert "NGRAM external corpora are installed per rank" in corpus.json()["message"]
    assert standin.calls == []


def test_other_routes_answer_as_before(served: tuple[Any, TokenizerManagerStandIn]) -> None:
    client, standin = served
    before = [client.get("/ready"), client.post("/flush_cache"), client.get("/no_such_route")]
    refused_routes.install(VERSION)
    after = [client.get("/ready"), client.post("/flush_cache"), client.get("/no_such_route")]
    assert [(a.status_code, a.content) for a in after] == [(b.status_code, b.content) for b in before]
    assert [a.status_code for a in after] == [200, 200, 404]
    assert standin.calls == [("flush_cache", 0.0)] * 2
    # Other methods on the refused paths are still SGLang's (405), as before.
    assert client.get("/update_weights_from_disk").status_code == 405


def _refused_routes(routes: list[Any]) -> dict[tuple[str, frozenset[str]], Any]:
    wanted = {(x.path, x.methods) for x in refused_routes.REFUSED}
    return {key: r for r in routes if (key := (getattr(r, "path", None), frozenset(getattr(r, "methods", None)
                                                                                      or ()))) in wanted}


def test_the_refusals_keep_sglangs_auth_level_and_route_class(http_server: ModuleType) -> None:
    levels = {k: r.endpoint._auth_level for k, r in _refused_routes(http_server.app.router.routes).items()}
    assert len(levels) == len(refused_routes.REFUSED)
    kinds = {type(r) for r in http_server.app.router.routes if getattr(r, "path", None) == "/flush_cache"}
    refused_routes.install(VERSION)
    after = _refused_routes(http_server.app.router.routes)
    assert {p: r.endpoint._auth_level for p, r in after.items()} == levels
    assert {type(r) for r in after.values()} == kinds
    assert all(r.endpoint.__pdfleet_patch__ == refused_routes.ID for r in after.values())


def test_a_target_whose_source_changed_is_refused_and_nothing_is_replaced(
        http_server: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    real_getsource = inspect.getsource
    changed = http_server.add_external_corpus

    def getsource(obj: Any) -> str:
        text = real_getsource(obj)
        return text + "    await start_loading_on_every_rank()\n" if obj is inspect.unwrap(changed) else text

    routes = list(http_server.app.router.routes)
    monkeypatch.setattr(targets.inspect, "getsource", getsource)
    with pytest.raises(base.PatchError, match=r"http_server\.add_external_corpus is not the function"):
        refused_routes.install(VERSION)
    assert http_server.app.router.routes == routes
    assert not hasattr(http_server.update_weights_from_disk, "__pdfleet_patch__")


def test_a_route_no_longer_served_by_its_function_is_refused(
        http_server: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    # SGLang moving the route to another handler (or router) leaves the module function unserved: replacing it
    # would refuse nothing.
    monkeypatch.setattr(http_server.app.router, "routes", [
        r for r in http_server.app.router.routes if getattr(r, "path", None) != "/update_weights_from_disk"])
    with pytest.raises(base.PatchError, match=r"has 0 routes for POST /update_weights_from_disk, expected 1"):
        refused_routes.install(VERSION)


def test_an_unknown_sglang_version_and_a_second_install_are_refused(http_server: ModuleType) -> None:
    with pytest.raises(base.PatchError, match=r"refused-routes was not checked against SGLang 0\.6\.1"):
        refused_routes.install("0.6.1")
    refused_routes.install(VERSION)
    with pytest.raises(base.PatchError, match="already patched by refused-routes"):
        refused_routes.install(VERSION)


def test_the_launcher_lists_what_every_engine_refuses() -> None:
    listing = launcher.list_patches()
    for refusal in refused_routes.REFUSED:
        assert f"{' '.join(sorted(refusal.methods))} {refusal.path} (403): {refusal.reason}" in listing
    assert "refused-routes (always" in listing


def test_the_engine_simulator_refuses_both_as_the_refused_engine_does(
        served: tuple[Any, TokenizerManagerStandIn]) -> None:
    import asyncio

    from aiohttp import web
    from aiohttp.test_utils import TestClient, TestServer

    from pdfleet.runtime.simulator import native_api

    client, _ = served
    refused_routes.install(VERSION)
    engine = {(r.path, method): client.request(method, r.path, json=WEIGHTS if "weights" in r.path else CORPUS)
              for r in refused_routes.REFUSED for method in sorted(r.methods)}

    async def ask(leader: bool) -> dict[str, tuple[int, Any]]:
        app = web.Application()
        native_api.add_routes(app, leader=leader, enable_metrics=False)
        async with TestClient(TestServer(app, host="127.0.0.1")) as sim:
            answers = {}
            for path, method in engine:
                async with sim.request(method, path, json=CORPUS) as answer:
                    answers[path, method] = (answer.status, await answer.json() if answer.status == 403 else None)
            return answers

    assert asyncio.run(ask(leader=True)) == {p: (a.status_code, a.json()) for p, a in engine.items()}
    # A node of rank > 0 serves health only, as SGLang's dummy health server does.
    assert {status for status, _ in asyncio.run(ask(leader=False)).values()} == {404}


class HiCacheStandIn(TokenizerManagerStandIn):
    async def attach_hicache_storage(self, **kwargs: Any) -> Any:
        self.calls.append(("attach_hicache_storage", kwargs))
        return self.io.AttachHiCacheStorageReqOutput(success=True, message="attached")

    async def detach_hicache_storage(self) -> Any:
        self.calls.append(("detach_hicache_storage", None))
        return self.io.DetachHiCacheStorageReqOutput(success=True, message="detached")


ATTACH = {"hicache_storage_backend": "file"}


def test_with_an_admin_key_hicache_storage_attach_and_detach_answer_403_and_reach_no_rank(
        http_server: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    """`--admin-api-key` is the user's to set; the two requests it would open, each decided per rank, stay shut."""
    from fastapi.testclient import TestClient

    io = requires.module("sglang.srt.managers.io_struct")
    standin = HiCacheStandIn(io, requires.module("sglang.srt.managers.tokenizer_manager").ServerStatus.Up)
    monkeypatch.setattr(http_server, "_global_state",
                        http_server._GlobalState(tokenizer_manager=standin, template_manager=None, scheduler_info={}))
    # SGLang's handlers read the key from its published serving config (published at launch, not here).
    monkeypatch.setattr(http_server, "get_serving", lambda: SimpleNamespace(admin_api_key="an-admin-key"))
    client = TestClient(http_server.app)  # its lifespan not run: it would start the engine
    try:
        opened = [client.put("/hicache/storage-backend", json=ATTACH), client.delete("/hicache/storage-backend")]
        assert [a.status_code for a in opened] == [200, 200], "unpatched, an admin key opens both"
        assert [name for name, _ in standin.calls] == ["attach_hicache_storage", "detach_hicache_storage"]
        standin.calls.clear()
        refused_routes.install(VERSION)
        shut = [client.put("/hicache/storage-backend", json=ATTACH), client.delete("/hicache/storage-backend")]
        assert [a.status_code for a in shut] == [403, 403]
        assert all("decides on its own whether it is idle" in a.json()["message"] for a in shut)
        assert standin.calls == []
    finally:
        client.close()
