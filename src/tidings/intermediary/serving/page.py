"""The web page that shows one subscriber's live view as a moving map.

An intermediary's server serves, beside its WebSocket endpoint, one HTML file and one
JavaScript module (package data in ``static/``, no framework, no build step):

* ``GET /view`` -- the page. Its query string is the subscription: ``?box=x0,y0,x1,y1``,
  ``?sphere=x,y,r`` (3D: one more coordinate each), ``&relative_to=ID`` for a region around
  an entity, ``&rate_hz=``, ``&priority=``, ``&float32=0|1``, ``&compress=0|1``,
  ``&max_entities=``;
* ``GET /view.js`` -- the module: it opens a WebSocket to the same server, subscribes, decodes
  the binary frames (:mod:`.generation`'s layout, :func:`.envelope.envelope`'s envelope) and
  draws them on a canvas;
* ``GET /view.json`` -- what the page cannot know by itself: the intermediary's dimension and
  world box, so that a bare ``/view`` shows the whole world (``"world": null`` if the
  intermediary has none, and the page then asks for a region);
* ``GET /auth`` -- who the request's credentials (or none) prove to be, as the WebSocket
  handshake would decide it: ``{"identity": name}``, or 401 and ``{"error": why}``. A
  browser cannot read why its WebSocket was refused, so the pages ask here first and show
  the reason (and a form for a token or a user and password); ``GET /auth.js`` is the
  module of both pages that does it.

The pages and their scripts hold no data and are served to anyone; the data flows over the
WebSocket, which admits only whom :mod:`.access` lets in.

The page does not validate the region: it passes the numbers as they are and shows the
server's ``{"op": "error"}`` message, so there is one validation, the server's.
"""

from __future__ import annotations

import math
from importlib import resources

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tidings.errors import AccessRefused
from tidings.intermediary.node.intermediary import Intermediary
from tidings.intermediary.serving.access import Gatekeeper

#: The page's files are small and never change while a server runs: read once.
_STATIC = resources.files("tidings.intermediary.serving") / "static"
#: A browser keeps no stale page or module across an upgrade of the server.
_REVALIDATE = {"Cache-Control": "no-cache"}


def _module(name: str) -> Route:
    """``GET /<name>.js``: the module ``static/<name>.js``."""
    script = (_STATIC / f"{name}.js").read_bytes()

    async def module(request: Request) -> Response:
        return Response(script, media_type="text/javascript; charset=utf-8", headers=_REVALIDATE)

    return Route(f"/{name}.js", module, methods=["GET"])


def static_page_routes(name: str) -> list[Route]:
    """``GET /<name>`` and ``GET /<name>.js``: the page ``static/<name>.html`` and its module."""
    html = (_STATIC / f"{name}.html").read_bytes()

    async def page(request: Request) -> Response:
        return Response(html, media_type="text/html; charset=utf-8", headers=_REVALIDATE)

    return [Route(f"/{name}", page, methods=["GET"]), _module(name)]


def page_routes(intermediary: Intermediary, access: Gatekeeper) -> list[Route]:
    """The page's routes, for the intermediary's Starlette application."""

    async def auth(request: Request) -> Response:
        client = request.client.host if request.client is not None else None
        try:
            grant = await access.admit(request.headers, client)
        except AccessRefused as exc:
            headers = dict(_REVALIDATE)
            if exc.retry_after_s is not None:  # the address is throttled (429)
                headers["Retry-After"] = str(math.ceil(exc.retry_after_s))
            return JSONResponse({"error": exc.reason}, exc.status, headers=headers)
        return JSONResponse({"identity": grant.identity}, headers=_REVALIDATE)

    async def defaults(request: Request) -> Response:
        world = intermediary.subscriptions.world
        return JSONResponse(
            {
                "dim": intermediary.dim,
                "world": None if world is None else {"lo": world.lo, "hi": world.hi},
            }
        )

    return [
        *static_page_routes("view"),
        Route("/view.json", defaults, methods=["GET"]),
        Route("/auth", auth, methods=["GET"]),
        _module("auth"),
    ]
