"""The HTTP side of the service: POST /predict, POST /reload, GET /health, /metadata, /metrics, and
the page at GET / (page.py).

Each route is a short function that reads its request, asks the service (service.py, which knows
no HTTP) and answers; `ROUTES` and `HANDLERS` register them all in one place, and `create_app`
puts them together with the service in `app.state`. Every refusal is a JSON `{"error": ...}`
with a 4xx or 503 status; nothing a client sends stops the service. POST /reload needs the reload
token; no answer names a folder of the server. A request sent by a page of another site is refused
(`SameOrigin`), and every answer says `X-Content-Type-Options: nosniff`.
"""

from __future__ import annotations

import hmac
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from functools import partial

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse
from starlette.datastructures import Headers, MutableHeaders
from starlette.exceptions import HTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from project.deploy.serve import bodies, page
from project.deploy.serve.bodies import RequestError
from project.deploy.serve.models import ModelSlot
from project.deploy.serve.sampler import Sampler
from project.deploy.serve.service import Service, Settings

MAX_TOP_K = 1000
QUERY_KEYS = ("top_k",)  # what /predict reads from its query string; anything else is a mistake
# refusals that may leave a body unread: the connection closes, after the rest is read and dropped
# (connections.py), instead of waiting for another request behind it
CLOSING = (408, 413, 503)
# browsers must not guess another type than the answer's (a JSON error echoing a client's bytes, read as
# HTML or script): said on every answer of the app, and on the protocol's own refusals (connections.py)
NOSNIFF = ("X-Content-Type-Options", "nosniff")


def parse_top_k(query: Sequence[tuple[str, str]], default: int) -> int:
    """?top_k= as 1 to MAX_TOP_K in ASCII digits; 400 for anything else in the query string."""
    unknown = sorted({key for key, _ in query if key not in QUERY_KEYS})
    if unknown:
        shown = ", ".join(repr(key[:40]) for key in unknown[:5])
        raise RequestError(
            400, f"Unknown query parameter {shown}.", "pass only ?top_k=N, e.g. /predict?top_k=3."
        )
    values = [value for _, value in query]
    if not values:
        return default
    raw = values[0]
    # str.isdigit() also accepts superscripts that int() refuses, and int() of 5,000 digits raises
    if (
        len(values) > 1
        or not (raw.isascii() and raw.isdigit() and len(raw) <= 4)
        or not 1 <= int(raw) <= MAX_TOP_K
    ):
        shown = (
            repr(raw[:20] + ("..." if len(raw) > 20 else ""))
            if len(values) == 1
            else f"given {len(values)} times"
        )
        raise RequestError(
            400,
            f"top_k {shown} is not one whole number from 1 to {MAX_TOP_K}.",
            "pass e.g. /predict?top_k=3.",
        )
    return int(raw)


def authorized(request: Request, token: str | None) -> None:
    """Nothing when the request carries the reload token; RequestError 403 (none set) or 401 otherwise."""
    if token is None:
        raise RequestError(
            403,
            "POST /reload is off: the service was started without a reload token.",
            "reload with SIGHUP (kill -HUP <pid>), or start serve with PROJECT_RELOAD_TOKEN=<secret> "
            "(or --reload_token_file FILE) and send the header 'Authorization: Bearer <secret>'.",
        )
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), token.encode()):
        raise RequestError(
            401, "POST /reload needs the reload token.", "send the header 'Authorization: Bearer <token>'."
        )


def service_of(request: Request) -> Service:
    return request.app.state.service


# the routes


async def predict(request: Request) -> JSONResponse:
    service = service_of(request)
    top_k = parse_top_k(request.query_params.multi_items(), service.settings.top_k)
    declared = request.headers.get("content-length", "")
    read = partial(bodies.image_bytes, request, service.settings.limits)
    return JSONResponse(await service.predict(declared, read, top_k))


async def reload_route(request: Request) -> dict:
    service = service_of(request)
    authorized(request, service.settings.reload_token)
    return await service.reload()


async def try_page() -> HTMLResponse:
    """A person's way to try the model: the page drops an image on /predict (page.py)."""
    return HTMLResponse(page.HTML, headers=page.HEADERS)


async def health(request: Request) -> dict:
    return service_of(request).health()


async def metadata_route(request: Request) -> dict:
    return service_of(request).metadata()


async def metrics(request: Request) -> dict:
    return service_of(request).metrics()


ROUTES = (  # (method, path, route): every route of the service
    ("POST", "/predict", predict),
    ("POST", "/reload", reload_route),
    ("GET", "/", try_page),
    ("GET", "/health", health),
    ("GET", "/metadata", metadata_route),
    ("GET", "/metrics", metrics),
)


# the answers to errors: always JSON {"error": ...}


def error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    # nosniff here too: Starlette answers an unforeseen error outside every added middleware
    headers = {**(headers or {}), NOSNIFF[0]: NOSNIFF[1]}
    return JSONResponse({"error": message}, status_code=status, headers=headers)


async def refused(request: Request, e: RequestError) -> JSONResponse:
    headers = {"Retry-After": "1"} if e.status in (429, 503) else {}
    if e.status in CLOSING:
        headers["Connection"] = "close"
    if e.status == 401:
        headers["WWW-Authenticate"] = "Bearer"
    return error(e.status, str(e), headers)


async def http_error(request: Request, e: HTTPException) -> JSONResponse:
    return error(e.status_code, str(e.detail), e.headers)


async def invalid(request: Request, e: RequestValidationError) -> JSONResponse:
    return error(422, str(e.errors()))


async def crashed(request: Request, e: Exception) -> JSONResponse:
    return error(500, f"Internal error ({type(e).__name__}); the service goes on. See the server log.")


HANDLERS = {
    RequestError: refused,
    HTTPException: http_error,
    RequestValidationError: invalid,
    Exception: crashed,
}


class StatusCounter:
    """ASGI middleware counting responses by status, for /metrics (cheaper than a BaseHTTPMiddleware)."""

    def __init__(self, app: ASGIApp, counts: Counter[int]) -> None:
        self.app = app
        self.counts = counts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        started = False

        async def counting_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                self.counts[message["status"]] += 1
            await send(message)

        try:
            await self.app(scope, receive, counting_send)
        except Exception:
            # Starlette answers these outside every added middleware (ServerErrorMiddleware, through
            # the app's catch-all handler): always a 500, which is counted here
            if not started:
                self.counts[500] += 1
            raise


class SameOrigin:
    """ASGI middleware: refuses requests that a page of another site sent, and marks answers nosniff.

    A browser sends `Origin` with every cross-origin request and with same-origin POSTs. A form on
    any web page a user visits can POST an image to /predict without asking the service first (a
    "simple" request: no CORS preflight), and the service would answer it and keep the image as a
    sample. So a request whose Origin is neither the service's own (http:// or https:// and the
    Host it was sent to) nor in `allowed` gets 403 before its body is read. Requests without
    Origin (curl, `infer`'s clients, a browser's same-origin GET) pass.
    """

    def __init__(self, app: ASGIApp, allowed: Sequence[str] = ()) -> None:
        self.app = app
        self.allowed = frozenset(allowed)

    def admits(self, headers: Headers) -> bool:
        origin = headers.get("origin")
        if origin is None:
            return True
        origin = origin.lower()
        host = headers.get("host", "").lower()
        return origin in self.allowed or (bool(host) and origin in (f"http://{host}", f"https://{host}"))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = Headers(scope=scope)
        if not self.admits(headers):
            refused = RequestError(
                403,
                f"Requests from the web page origin {headers['origin'][:100]!r} are refused.",
                "call the service from its own page, from a program (which sends no Origin), or start "
                "serve with --allow_origin naming that origin.",
            )
            # the body is left unread: close, after reading and dropping it (connections.py)
            return await error(403, str(refused), {"Connection": "close"})(scope, receive, send)

        async def nosniff_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                MutableHeaders(scope=message).setdefault(*NOSNIFF)
            await send(message)

        await self.app(scope, receive, nosniff_send)


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    """Startup and shutdown: the service's batcher, thread pool and SIGHUP handler live while it runs."""
    service: Service = app.state.service
    service.start()
    if app.state.banner:
        print(app.state.banner, flush=True)
    try:
        yield
    finally:
        await service.stop()


def create_app(
    slot: ModelSlot, settings: Settings, sampler: Sampler | None = None, banner: str = ""
) -> FastAPI:
    """The service around `slot` as an ASGI app; `banner` is printed once it has started."""
    docs = {} if settings.api_docs else {"docs_url": None, "redoc_url": None, "openapi_url": None}
    app = FastAPI(
        title="Image classification service", lifespan=lifespan, exception_handlers=HANDLERS, **docs
    )
    service = Service(slot, settings, sampler)
    app.state.service = service  # what the routes and the lifespan reach through their request or app
    app.state.banner = banner
    if settings.allow_origins:  # pages of these sites may read the answers too (CORS)
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.allow_origins,
            allow_methods=["GET", "POST"],
            allow_headers=["Content-Type"],
        )
    app.add_middleware(SameOrigin, allowed=settings.allow_origins)
    app.add_middleware(StatusCounter, counts=service.statuses)  # the last added sees every answer
    for method, path, route in ROUTES:
        app.add_api_route(path, route, methods=[method])
    return app
