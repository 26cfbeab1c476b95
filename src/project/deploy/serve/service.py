"""What the service does, without HTTP: the served model, its batcher, the body budget and the counters.

A prediction holds what its body declares in the shared budget of body memory (body_memory.py)
while it is read and answered. Its image reserves, from its header, what decoding it will hold,
is decoded and preprocessed in a thread pool (Pillow releases the GIL, so decoding overlaps with
other requests and with the model), gives that reservation back, then waits for its place in a
batch (batching.py). The answer is offered to the sampler, when there is one.

A reload (POST /reload or SIGHUP) loads the export `--model` points at and swaps it in
(models.py); one runs at a time, and a failed one keeps the model being served. Its message names
files but never the server's folders.

Every refusal is a RequestError carrying its status; the routes (app.py) turn it into an answer.
"""

from __future__ import annotations

import asyncio
import logging
import re
import signal
from collections import Counter
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from project.deploy.serve.batching import Batcher, Overloaded
from project.deploy.serve.bodies import Limits, RequestError, decoding_cost
from project.deploy.serve.body_memory import BodyBudget
from project.deploy.serve.models import ModelSlot
from project.deploy.serve.predictions import Prepared, answer, prepare, run_batch
from project.deploy.serve.sampler import Sampler
from project.errors import UserError, user_message

log = logging.getLogger("uvicorn.error")
# what signal handlers raise off the main thread (an embedding test client) or on Windows
NO_SIGNALS = (ValueError, RuntimeError, NotImplementedError, AttributeError)
# the folders of absolute paths (POSIX or Windows) in error messages, quoted (spaces allowed) or
# bare: answers keep the file names only
QUOTED_FOLDERS = re.compile(r"(?<=')(?:[A-Za-z]:)?[/\\][^'\n]*[/\\](?=[^'/\\\n]*')")
FOLDERS = re.compile(r"(?<![\w.~-])(?:[A-Za-z]:)?(?:[/\\][^\s'\"/\\:]+)+[/\\](?=[^\s'\"/\\])")


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
    allow_origins: tuple[str, ...] = ()  # web page origins besides the service's own that may call it


def without_folders(text: str) -> str:
    """`text` with the folders of absolute paths removed: answers name files, never where they live."""
    return FOLDERS.sub("", QUOTED_FOLDERS.sub("", text))


class Service:
    """The state of one running service and what it does; `start()` and `stop()` bound its life.

    Args:
        slot: the served model, and reloading it.
        settings: the service's flags.
        sampler: where a share of the requests and answers is kept; None keeps none.
    """

    def __init__(self, slot: ModelSlot, settings: Settings, sampler: Sampler | None = None) -> None:
        self.slot = slot
        self.settings = settings
        self.sampler = sampler
        self.batcher: Batcher[Prepared, tuple[np.ndarray, int]] = Batcher(
            run_batch, settings.max_batch_size, settings.max_wait_ms, settings.max_pending
        )
        self.decode_pool = ThreadPoolExecutor(settings.decode_threads, thread_name_prefix="decode")
        self.budget = BodyBudget(settings.max_body_memory)
        self.statuses: Counter[int] = Counter()  # responses by status, counted by the app's middleware
        self._background: set[asyncio.Task] = set()  # the loop keeps only weak references to tasks

    def start(self) -> None:
        """Start the batcher and reload on SIGHUP (where signals can be handled); on the event loop."""
        self.batcher.start()
        with suppress(*NO_SIGNALS):
            asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, self._on_sighup)

    async def stop(self) -> None:
        """Stop reloading on SIGHUP, cancel what waits for a batch, and write the queued samples."""
        with suppress(*NO_SIGNALS):
            asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)
        await self.batcher.stop()
        self.decode_pool.shutdown(wait=True)
        if self.sampler is not None:
            await asyncio.to_thread(self.sampler.close)

    async def predict(self, declared_length: str, read: Callable[[], Awaitable[bytes]], top_k: int) -> dict:
        """The answer for the image `read()` returns, its body's `declared_length` held in the budget.

        Args:
            declared_length: the body's Content-Length, "" when it declares none.
            read: reads the image file, within the request's limits.
            top_k: classes in the answer.
        """
        reserved = self.budget.reserve(declared_length, self.settings.limits)
        try:
            with self.batcher.arriving():  # a batch being gathered waits for this image
                data = await read()
                prepared = await self._prepare(data)
            return await self._classify(prepared, data, top_k)
        finally:
            self.budget.release(reserved)

    async def _prepare(self, data: bytes) -> Prepared:
        """Decode and preprocess `data` in the decode pool, its decoding memory held in the budget."""
        loop = asyncio.get_running_loop()
        max_pixels = self.settings.limits.max_pixels
        cost = await loop.run_in_executor(self.decode_pool, decoding_cost, data, max_pixels)
        reserved = self.budget.reserve_decoding(*cost)
        try:
            return await loop.run_in_executor(self.decode_pool, prepare, data, self.slot.current, max_pixels)
        finally:
            self.budget.release_decoding(reserved)

    async def _classify(self, prepared: Prepared, data: bytes, top_k: int) -> dict:
        """Run `prepared` in a batch and answer; the answer and `data` are offered to the sampler."""
        try:
            outputs, batch_size = await self.batcher.submit(prepared)
        except Overloaded as e:
            raise RequestError(503, f"The service is overloaded: {e}.", "retry after a second.") from None
        result = answer(prepared.model, outputs, top_k, batch_size)
        if self.sampler is not None:
            record = {"width": prepared.width, "height": prepared.height, **result}
            self.sampler.offer(data, prepared.image_format, record)
        return result

    async def reload(self) -> dict:
        """Swap in the export `--model` points at now; RequestError 429 while one runs, 500 on failure."""
        slot = self.slot
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

    def _on_sighup(self) -> None:
        task = asyncio.get_running_loop().create_task(self._reload_logged())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _reload_logged(self) -> None:
        try:
            await self.reload()
        except RequestError as e:  # reload() logged a failure; there is no client to answer
            if e.status == 429:
                log.warning("SIGHUP ignored: a reload is already in progress")

    def health(self) -> dict:
        return {"status": "ok", "version": self.slot.current.version}

    def metadata(self) -> dict:
        """The served model (its file name, not its folder), what it expects, and the service's limits."""
        model, settings = self.slot.current, self.settings
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

    def metrics(self) -> dict:
        """Counters since the start: responses, batches, memory held, reloads, samples."""
        sizes, budget, slot = self.batcher.batch_sizes, self.budget, self.slot
        return {
            "version": slot.current.version,
            "responses_by_status": {str(k): v for k, v in sorted(self.statuses.items())},
            "batches": sum(sizes.values()),
            "batched_images": sum(size * n for size, n in sizes.items()),
            "batch_sizes": {str(k): v for k, v in sorted(sizes.items())},
            "pending": self.batcher.pending,
            "body_bytes_held": budget.held - budget.decoding,
            "decoding_bytes_held": budget.decoding,
            "refused_over_body_budget": budget.refused,
            "reloads": slot.reloads,
            "failed_reloads": slot.failed_reloads,
            "sampler": self.sampler.stats() if self.sampler is not None else None,
        }
