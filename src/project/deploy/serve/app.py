"""The HTTP routes: POST /predict, POST /reload, GET /health, /metadata and /metrics, and the page at GET /.

A /predict request reads its body on the event loop (within the limits and the shared budget of
body memory), decodes and preprocesses it in a thread pool (Pillow releases the GIL, so decoding
overlaps with other requests and with the model), then waits for its place in a batch. Every
refusal is a JSON `{"error": ...}` with a 4xx or 503 status; nothing a client sends stops the
service. POST /reload needs the reload token; no answer names a folder of the server.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import re
import signal
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager, suppress
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from project.deploy.calibration import UNKNOWN
from project.deploy.serve import bodies, memory, page
from project.deploy.serve.batching import Batcher, Overloaded
from project.deploy.serve.bodies import Limits, RequestError
from project.deploy.serve.models import LoadedModel, ModelSlot
from project.deploy.serve.sampler import Sampler
from project.errors import UserError, user_message

log = logging.getLogger("uvicorn.error")
# what signal handlers raise off the main thread (an embedding test client) or on Windows
NO_SIGNALS = (ValueError, RuntimeError, NotImplementedError, AttributeError)
MAX_TOP_K = 1000
QUERY_KEYS = ("top_k",)  # what /predict reads from its query string; anything else is a mistake
# the folders of absolute paths (POSIX or Windows) in error messages, quoted (spaces allowed) or
# bare: answers keep the file names only
QUOTED_FOLDERS = re.compile(r"(?<=')(?:[A-Za-z]:)?[/\\][^'\n]*[/\\](?=[^'/\\\n]*')")
FOLDERS = re.compile(r"(?<![\w.~-])(?:[A-Za-z]:)?(?:[/\\][^\s'\"/\\:]+)+[/\\](?=[^\s'\"/\\])")
# refusals that may leave a body unread: the connection closes, after the rest is read and dropped
# (connections.py), instead of waiting for another request behind it
CLOSING = (408, 413, 503)


@dataclass(frozen=True)
class Settings:
    top_k: int
    max_batch_size: int
    max_wait_ms: float
    max_pending: int
    decode_threads: int
    limits: Limits
    max_body_memory: int = 256 * 2**20  # bytes of request bodies held at once, all requests together
    reload_token: str | None = None  # POST /reload is refused without one
    api_docs: bool = False  # /docs and /openapi.json


class BodyBudget:
    """Bytes of request bodies and decoded images held at once, summed over all requests; beyond it 503.

    Per-request limits do not bound the sum: 50 concurrent 19 MB bodies held 3.5 GB. Each request
    reserves what its Content-Length declares (the most a chunked body may hold, when it declares
    nothing) before reading, and gives it back when answered. Decoded pixels cost far more than
    their file (a 286 KB animated WebP took 827 MB), so each image also reserves what decoding
    it will hold, from its header, before any pixel is decoded. Event-loop only, so no lock.
    """

    TRIM_AFTER = 64 * 2**20  # bytes of bodies released before the heaps are trimmed, once none is held

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.held = 0
        self.decoding = 0  # the part of `held` reserved for decoding images
        self.refused = 0
        self._released = 0

    def reserve(self, request: Request, limits: Limits) -> int:
        declared = request.headers.get("content-length", "")
        size = int(declared) if declared.isascii() and declared.isdigit() and len(declared) < 19 else None
        if size is not None and size > limits.max_body_bytes:
            return 0  # refused with 413 when read, before any of it is kept
        size = limits.max_body_bytes if size is None else size
        self._take(size)
        return size

    def reserve_decoding(self, size: int, width: int, height: int) -> int:
        """Reserve `size` bytes for decoding a width x height image: 413 when it alone passes the budget."""
        if size > self.max_bytes:
            raise RequestError(
                413,
                f"The image is {width}x{height} pixels: decoding it takes about {size / 2**20:.0f} MB, "
                f"more than the service's budget of {self.max_bytes / 2**20:.0f} MB for request bodies "
                "and decoded images.",
                "send a smaller image (the model sees it resized anyway), or raise --max_body_memory_mb.",
            )
        self._take(size)
        self.decoding += size
        return size

    def release_decoding(self, size: int) -> None:
        self.decoding -= size
        self.release(size)

    def _take(self, size: int) -> None:
        if self.held + size > self.max_bytes:
            self.refused += 1
            raise RequestError(
                503,
                f"The service holds {self.held} bytes of request bodies and decoded images; {size} more "
                f"would pass its budget of {self.max_bytes}.",
                "retry after a second (or raise --max_body_memory_mb).",
            )
        self.held += size

    def release(self, size: int) -> None:
        self.held -= size
        self._released += size
        if self.held == 0 and self._released >= self.TRIM_AFTER:  # a burst of large bodies has ended
            self._released = 0
            asyncio.get_running_loop().run_in_executor(None, memory.trim)


@dataclass(frozen=True)
class Prepared:
    """One request's image, ready for a batch: the model it was preprocessed for travels with it."""

    model: LoadedModel
    array: np.ndarray  # uint8 [3, size, size]
    width: int
    height: int
    image_format: str | None


def run_batch(items: Sequence[Prepared]) -> list[tuple[np.ndarray, int]]:
    """(logits, batch size) per item. Items preprocessed for an older model run on that model."""
    results: list[tuple[np.ndarray, int]] = [(np.empty(0), 0)] * len(items)
    groups: dict[int, list[int]] = {}
    for i, item in enumerate(items):
        groups.setdefault(id(item.model), []).append(i)
    for indices in groups.values():
        model = items[indices[0]].model
        logits = model.classifier.logits(np.stack([items[i].array for i in indices]))
        for i, p in zip(indices, logits, strict=True):
            results[i] = (p, len(indices))
    return results


def prepare(data: bytes, model: LoadedModel, max_pixels: int) -> Prepared:
    """Decode and preprocess exactly as `infer` does (runs in the decode pool)."""
    image, image_format = bodies.decode(data, max_pixels)
    return Prepared(model, model.classifier.preprocess(image), image.width, image.height, image_format)


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


def answer(model: LoadedModel, logits: np.ndarray, top_k: int, batch_size: int) -> dict:
    """The JSON answer for one image's logits: calibrated top-k, `unknown` below the export's threshold."""
    classifier = model.classifier
    probabilities = classifier.probabilities_of(logits[None])[0]
    names, probs = classifier.top(probabilities, top_k)
    result = {
        "version": model.version,
        "predictions": [{"class_name": n, "probability": p} for n, p in zip(names, probs, strict=True)],
        "batch_size": batch_size,
    }
    if not classifier.multilabel:
        unknown, scores = classifier.unknown(logits[None])
        result["class_name"] = UNKNOWN if unknown[0] else names[0]
        if scores is not None:
            calibration = classifier.calibration
            result["unknown"] = {
                "score": calibration.score_name,
                "value": float(scores[0]),
                "threshold": calibration.threshold,
                "accept": calibration.accept,
                "reason": calibration.reason(float(scores[0])) or None,  # why it is `unknown`
            }
    if model.classifier.multilabel:  # every label at or above the export's threshold, not only the top k
        threshold = model.classifier.threshold
        all_names = model.classifier.class_names
        result["labels"] = [n for n, p in zip(all_names, probabilities, strict=True) if p >= threshold]
    return result


def without_folders(text: str) -> str:
    """`text` with the folders of absolute paths removed: answers name files, never where they live."""
    return FOLDERS.sub("", QUOTED_FOLDERS.sub("", text))


def metadata(model: LoadedModel, settings: Settings) -> dict:
    classifier = model.classifier
    return {
        "version": model.version,
        "model": Path(model.path).name,
        "loaded_at": model.loaded_at,
        "class_names": classifier.class_names,
        "image_size": classifier.size,
        "task": classifier.task,
        "input": "an image file (JPEG, PNG, BMP, GIF, TIFF, WebP, binary PPM): "
        "raw body or multipart field 'file'",
        "batching": {"max_batch_size": settings.max_batch_size, "max_wait_ms": settings.max_wait_ms},
        "limits": asdict(settings.limits),
        "sidecar": classifier.sidecar.public(),
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


def error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=headers)


def authorized(request: Request, token: str | None) -> None:
    """Nothing when the request carries the reload token; RequestError 403 (none set) or 401 otherwise."""
    if token is None:
        raise RequestError(
            403,
            "POST /reload is off: the service was started without a reload token.",
            "reload with SIGHUP (kill -HUP <pid>), or start serve with PROJECT_RELOAD_TOKEN=<secret> "
            "(or --reload_token) and send the header 'Authorization: Bearer <secret>'.",
        )
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), token.encode()):
        raise RequestError(
            401, "POST /reload needs the reload token.", "send the header 'Authorization: Bearer <token>'."
        )


def create_app(
    slot: ModelSlot, settings: Settings, sampler: Sampler | None = None, banner: str = ""
) -> FastAPI:
    """The service around `slot`; the batcher, thread pool and SIGHUP handler live as long as it runs."""
    batcher: Batcher[Prepared, tuple[np.ndarray, int]] = Batcher(
        run_batch, settings.max_batch_size, settings.max_wait_ms, settings.max_pending
    )
    decode_pool = ThreadPoolExecutor(settings.decode_threads, thread_name_prefix="decode")
    statuses: Counter[int] = Counter()
    budget = BodyBudget(settings.max_body_memory)
    background: set[asyncio.Task] = set()

    async def reload() -> dict:
        if slot.reloading:  # each reload loads a model: queued ones would starve the predictions
            raise RequestError(
                429, "A reload is already in progress.", "retry after it ends (a few seconds)."
            )
        before = slot.current.version
        try:
            old, new = await slot.reload()
        except UserError as e:
            message = f"Reload failed; still serving version {before}. {user_message(e)}"
            log.error("%s", message)  # the full paths stay in the server's log
            raise RequestError(500, without_folders(message)) from e
        except Exception as e:  # unforeseen (a link loop raises RuntimeError): answered like the others
            log.exception("Reload failed; still serving version %s", before)
            raise RequestError(
                500,
                f"Reload failed; still serving version {before}: {type(e).__name__} while loading the model.",
                "see the server log for the cause, correct the export (or its link), then reload again.",
            ) from e
        log.info("Reloaded %s: version %s -> %s", slot.model, old.version, new.version)
        return {
            "version": new.version,
            "previous_version": old.version,
            "changed": new.version != old.version,
        }

    def on_sighup() -> None:
        async def reload_logged() -> None:
            try:
                await reload()
            except RequestError as e:  # reload() logged a failure; there is no client to answer
                if e.status == 429:
                    log.warning("SIGHUP ignored: a reload is already in progress")

        task = asyncio.get_running_loop().create_task(reload_logged())
        background.add(task)  # the loop keeps only weak references to tasks
        task.add_done_callback(background.discard)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        batcher.start()
        loop = asyncio.get_running_loop()
        with suppress(*NO_SIGNALS):
            loop.add_signal_handler(signal.SIGHUP, on_sighup)
        if banner:
            print(banner, flush=True)
        try:
            yield
        finally:
            with suppress(*NO_SIGNALS):
                loop.remove_signal_handler(signal.SIGHUP)
            await batcher.stop()
            decode_pool.shutdown(wait=True)
            if sampler is not None:
                await asyncio.to_thread(sampler.close)

    docs = {} if settings.api_docs else {"docs_url": None, "redoc_url": None, "openapi_url": None}
    app = FastAPI(title="Image classification service", lifespan=lifespan, **docs)
    app.add_middleware(StatusCounter, counts=statuses)

    @app.exception_handler(RequestError)
    async def refused(request: Request, e: RequestError) -> JSONResponse:
        headers = {"Retry-After": "1"} if e.status in (429, 503) else {}
        if e.status in CLOSING:
            headers["Connection"] = "close"
        if e.status == 401:
            headers["WWW-Authenticate"] = "Bearer"
        return error(e.status, str(e), headers)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, e: HTTPException) -> JSONResponse:
        return error(e.status_code, str(e.detail), e.headers)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, e: RequestValidationError) -> JSONResponse:
        return error(422, str(e.errors()))

    @app.exception_handler(Exception)
    async def crashed(request: Request, e: Exception) -> JSONResponse:
        return error(500, f"Internal error ({type(e).__name__}); the service goes on. See the server log.")

    @app.post("/predict")
    async def predict(request: Request) -> JSONResponse:
        top_k = parse_top_k(request.query_params.multi_items(), settings.top_k)
        reserved = budget.reserve(request, settings.limits)
        try:
            return await predict_within_budget(request, top_k)
        finally:
            budget.release(reserved)

    async def predict_within_budget(request: Request, top_k: int) -> JSONResponse:
        loop = asyncio.get_running_loop()
        with batcher.arriving():
            data = await bodies.image_bytes(request, settings.limits)
            max_pixels = settings.limits.max_pixels
            cost = await loop.run_in_executor(decode_pool, bodies.decoding_cost, data, max_pixels)
            reserved = budget.reserve_decoding(*cost)
            try:
                prepared = await loop.run_in_executor(decode_pool, prepare, data, slot.current, max_pixels)
            finally:
                budget.release_decoding(reserved)
        try:
            logits, batch_size = await batcher.submit(prepared)
        except Overloaded as e:
            raise RequestError(503, f"The service is overloaded: {e}.", "retry after a second.") from None
        result = answer(prepared.model, logits, top_k, batch_size)
        if sampler is not None:
            record = {"width": prepared.width, "height": prepared.height, **result}
            sampler.offer(data, prepared.image_format, record)
        return JSONResponse(result)

    @app.post("/reload")
    async def reload_route(request: Request) -> dict:
        authorized(request, settings.reload_token)
        return await reload()

    @app.get("/", response_class=HTMLResponse)
    async def try_page() -> HTMLResponse:  # a person's way to try the model (page.py)
        return HTMLResponse(page.HTML, headers=page.HEADERS)

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok", "version": slot.current.version}

    @app.get("/metadata")
    async def metadata_route() -> dict:
        return metadata(slot.current, settings)

    @app.get("/metrics")
    async def metrics() -> dict:
        sizes = batcher.batch_sizes
        return {
            "version": slot.current.version,
            "responses_by_status": {str(k): v for k, v in sorted(statuses.items())},
            "batches": sum(sizes.values()),
            "batched_images": sum(size * n for size, n in sizes.items()),
            "batch_sizes": {str(k): v for k, v in sorted(sizes.items())},
            "pending": batcher.pending,
            "body_bytes_held": budget.held - budget.decoding,
            "decoding_bytes_held": budget.decoding,
            "refused_over_body_budget": budget.refused,
            "reloads": slot.reloads,
            "failed_reloads": slot.failed_reloads,
            "sampler": sampler.stats() if sampler is not None else None,
        }

    return app
