"""The requests every pdfleet engine refuses (`pdfleet.runtime.refused_routes`), refused here the same way: the
same paths, status and body, so a client of the local fleet meets what a client of a real engine meets."""

from __future__ import annotations

from aiohttp import web
from aiohttp.typedefs import Handler

from pdfleet.runtime import refused_routes


def add_routes(app: web.Application) -> None:
    for refusal in refused_routes.REFUSED:
        for method in sorted(refusal.methods):
            app.router.add_route(method, refusal.path, _refusing(refusal))


def _refusing(refusal: refused_routes.Refusal) -> Handler:
    async def refused(request: web.Request) -> web.Response:
        return web.json_response(refusal.body(), status=refused_routes.STATUS)

    return refused
