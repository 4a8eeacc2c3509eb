"""SGLang HTTP requests no pdfleet engine runs: refused at the engine's HTTP server, with the reason, always.

Twelve run-time control requests of SGLang's server desync a tensor-parallel group, with or without an admin key
(docs/desync-audit.md items 12 to 14 and 16):
- `POST /update_weights_from_disk`: every rank loads the checkpoint and catches its own failure; a rank whose load
  fails skips the CUDA-graph recapture and the cache flush its peers run, and SGLang's "rollback" re-reads the new
  checkpoint. In pdfleet a pool's model changes by a rollout of `spec.model`, which replaces engine pods.
- `POST /update_weights_from_tensor`, `/update_weights_from_distributed`, `/update_weights_from_ipc`: the same
  per-rank outcome (each rank's own load result decides its cache flush; the ranks go on with different weights
  where one failed), from tensors, a weights-update process group or checkpoint-engine's IPC.
- `POST /add_external_corpus`: every rank installs an NGRAM corpus when its own loader thread finishes, so ranks
  draft different tokens for the same requests in between.
- `POST /init_weights_update_group`, `/init_weights_send_group_for_remote_instance`,
  `/send_weights_to_remote_instance`: each rank sets up its weight process group, barrier and broadcast in its own
  try/except, so a rank that fails goes on while its peers wait in the collective.
- `GET|POST /release_memory_occupation`, `/resume_memory_occupation`: each rank asserts its own idleness (a busy
  rank kills the engine) and releases or resumes its memory on its own.
- `PUT|DELETE /hicache/storage-backend`: HiCache storage attached or detached at run time; each rank refuses on its
  own idleness, in front of the storage process groups its peers create or destroy (SGLang serves them only to an
  engine with `--admin-api-key`; `GET` of the same path, a read, stays SGLang's).

Not a catalogue patch: an engine pdfleet starts never runs any of them. Each route function is verified like every
patch target (SGLang version, fingerprint of the function replaced) and must be the endpoint of its route in
SGLang's FastAPI `app`; the route is then replaced in the app's route table by one that answers 403 with SGLang's
`{"success": false, "message": ...}` shape, so nothing reaches the tokenizer manager, let alone a rank. (Replacing
only the module's function would change nothing: FastAPI built each route's handler from it at import.)

The launcher installs this in its own process (where `run_server` serves the app) before it starts anything, and
`engine_setup` in any engine process that imports SGLang's HTTP server later (tokenizer workers re-import the app).
Standard library only at import time; FastAPI is imported when installing, from SGLang's own environment.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Mapping
from http import HTTPStatus
from typing import Any

from pdfleet.runtime.patches import base, targets

ID = "refused-routes"
MODULE = "sglang.srt.entrypoints.http_server"
STATUS = HTTPStatus.FORBIDDEN


@dataclasses.dataclass(frozen=True)
class Refusal:
    path: str
    function: str  # the route function's name in MODULE
    reason: str
    methods: frozenset[str] = frozenset({"POST"})  # what SGLang serves the path for, all refused

    @property
    def dotted(self) -> str:
        return f"{MODULE}.{self.function}"

    def body(self) -> dict[str, Any]:
        return {"success": False, "message": self.reason}


REFUSED = (
    Refusal("/update_weights_from_disk", "update_weights_from_disk",
            "refused by pdfleet: each tensor-parallel rank loads the checkpoint and catches its own failure, so a "
            "load that fails on some ranks desyncs the group and SGLang's rollback re-reads the new checkpoint "
            "(docs/desync-audit.md item 13); roll out spec.model instead"),
    *(Refusal(f"/{name}", name,
              "refused by pdfleet: each tensor-parallel rank loads the weights and catches its own failure, so an "
              "update that fails on some ranks leaves the group with different weights and caches, the cache flush "
              "run only where it succeeded (docs/desync-audit.md item 13); roll out spec.model instead")
      for name in ("update_weights_from_tensor", "update_weights_from_distributed", "update_weights_from_ipc")),
    Refusal("/add_external_corpus", "add_external_corpus",
            "refused by pdfleet: NGRAM external corpora are installed per rank, each when its own loader thread "
            "finishes, so the ranks draft different tokens for the same requests (docs/desync-audit.md item 14)"),
    *(Refusal(f"/{name}", name,
              "refused by pdfleet: each tensor-parallel rank sets up its weight process group, barrier and "
              "broadcast inside its own try/except, so a rank that fails goes on while its peers wait in the "
              "collective (docs/desync-audit.md item 16); roll out spec.model instead")
      for name in ("init_weights_update_group", "init_weights_send_group_for_remote_instance",
                   "send_weights_to_remote_instance")),
    *(Refusal(f"/{name}", name,
              "refused by pdfleet: each tensor-parallel rank asserts on its own that it is idle, so a release "
              "while one rank is busy kills the engine, and the ranks release and resume their memory one by one "
              "(docs/desync-audit.md item 16)", frozenset({"GET", "POST"}))
      for name in ("release_memory_occupation", "resume_memory_occupation")),
    *(Refusal("/hicache/storage-backend", f"{verb}_hicache_storage_backend",
              f"refused by pdfleet: each tensor-parallel rank decides on its own whether it is idle enough to {verb} "
              "HiCache storage, so a rank busy when its peers are idle goes on while they create (or destroy) the "
              "storage process groups without it (docs/desync-audit.md item 12); set the storage back-end in "
              "spec.engine.extraArgs and roll it out", frozenset({method}))
      for verb, method in (("attach", "PUT"), ("detach", "DELETE"))),
)

FINGERPRINTS: Mapping[str, Mapping[str, str]] = {
    "0.5.23": {
        f"{MODULE}.update_weights_from_disk": "aeb43a6540b9503a",
        f"{MODULE}.update_weights_from_tensor": "e45826457a7f725b",
        f"{MODULE}.update_weights_from_distributed": "1fd4e723251eaf60",
        f"{MODULE}.update_weights_from_ipc": "af83583928a463a4",
        f"{MODULE}.add_external_corpus": "c6e2687fdae4ad50",
        f"{MODULE}.init_weights_update_group": "c74bdd7e4175a31f",
        f"{MODULE}.init_weights_send_group_for_remote_instance": "6d8b17d6de6f53a5",
        f"{MODULE}.send_weights_to_remote_instance": "d751158ddb4a357f",
        f"{MODULE}.release_memory_occupation": "5db8f130328dd23e",
        f"{MODULE}.resume_memory_occupation": "7a5289e040e2a91b",
        f"{MODULE}.attach_hicache_storage_backend": "db29b0fdd5fc7e72",
        f"{MODULE}.detach_hicache_storage_backend": "cd4638f2006de249",
    },
}


def describe() -> str:
    """What every engine refuses, for the launcher's `patches` listing."""
    rows = [f"  {' '.join(sorted(r.methods))} {r.path} ({STATUS.value}): {r.reason}" for r in REFUSED]
    return "\n".join([f"{ID} (always, every engine; not a catalogue choice)", *rows])


def install(sglang_version: str) -> base.Applied:
    """Verifies every refused route's function and its place in SGLang's app, then replaces them all; raises
    `base.PatchError` naming every problem, having replaced none."""
    fingerprints = FINGERPRINTS.get(sglang_version)
    if fingerprints is None:
        raise base.PatchError(f"{ID} was not checked against SGLang {sglang_version} "
                              f"(checked: {', '.join(sorted(FINGERPRINTS)) or 'none'})")
    problems: list[str] = []
    planned: list[tuple[Refusal, targets.Target, int]] = []
    app: Any = None
    for refusal in REFUSED:
        try:
            target = targets.verify(refusal.dotted, fingerprints[refusal.dotted])
            app = importlib.import_module(MODULE).app
            planned.append((refusal, target, _route_index(app, refusal, target.function)))
        except targets.TargetError as e:
            problems.append(str(e))
    if problems:
        raise base.PatchError(f"{ID}: " + "; ".join(problems))
    routes = list(app.router.routes)
    for refusal, target, index in planned:
        refuse = base.mark(_refusing(refusal, target.function), ID, target.function)
        route = routes[index]
        # A route of SGLang's own class (ORJSONRoute), so the app serves it as it serves its others.
        routes[index] = type(route)(route.path, refuse, methods=sorted(route.methods), name=route.name,
                                    include_in_schema=route.include_in_schema)
        target.replace(refuse)
    # A new list, not an edit of SGLang's: the router reads it on every request, and a test can put the old back.
    app.router.routes = routes
    return base.Applied(id=ID, targets=tuple(r.dotted for r in REFUSED))


def _route_index(app: Any, refusal: Refusal, function: Callable[..., Any]) -> int:
    """Where in the route table `function` serves `refusal.path` for `refusal.methods`: the only route of that path
    with those methods (a path may have others, for other methods: HiCache's storage back-end has GET, PUT and
    DELETE)."""
    from fastapi.routing import APIRoute

    found = [i for i, route in enumerate(app.router.routes) if getattr(route, "path", None) == refusal.path
             and set(getattr(route, "methods", None) or ()) & refusal.methods]
    if len(found) != 1:
        raise targets.TargetError(f"{MODULE}.app has {len(found)} routes for {' '.join(sorted(refusal.methods))} "
                                  f"{refusal.path}, expected 1")
    route = app.router.routes[found[0]]
    if not isinstance(route, APIRoute) or route.endpoint is not function or route.methods != refusal.methods:
        raise targets.TargetError(f"{MODULE}.app's route {refusal.path} is not {' '.join(sorted(refusal.methods))} "
                                  f"{refusal.dotted}: SGLang changed how it serves it; check the refusal against it")
    return found[0]


def _refusing(refusal: Refusal, original: Callable[..., Any]) -> Callable[..., Any]:
    from starlette.responses import JSONResponse

    # No parameters: FastAPI reads no body, so a request is refused whatever it carries.
    async def refused() -> JSONResponse:
        return JSONResponse(refusal.body(), status_code=STATUS)

    refused.__name__ = refused.__qualname__ = refusal.function
    refused.__doc__ = refusal.reason
    if hasattr(original, "_auth_level"):  # SGLang's API-key middleware reads it from the route's endpoint
        refused._auth_level = original._auth_level  # type: ignore[attr-defined]
    return refused
