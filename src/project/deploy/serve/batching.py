"""Dynamic batching: requests that arrive together share one model call.

One worker task takes the oldest waiting item, then gathers more until the batch holds
`max_batch_size` items or `max_wait_ms` have passed since it took the first, and runs the batch in
a thread of its own so that the event loop keeps reading requests meanwhile. Items that arrive
while a batch runs wait in the queue and form the next one: under load batches fill up even with
no wait at all. The worker waits only while more items are on their way (callers announce them
with `arriving()` while they read and decode a request): a lone request never waits.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Generic, TypeVar

Item = TypeVar("Item")
Result = TypeVar("Result")
log = logging.getLogger("uvicorn.error")


class Overloaded(Exception):
    """More items wait than `max_pending`: the caller should answer 503 at once instead of queueing."""


class Batcher(Generic[Item, Result]):
    """Group submitted items into calls of `run(items) -> results` (one result per item, in order)."""

    def __init__(
        self,
        run: Callable[[Sequence[Item]], Sequence[Result]],
        max_batch_size: int,
        max_wait_ms: float,
        max_pending: int,
    ) -> None:
        self.run = run
        self.max_batch_size = max_batch_size
        self.max_wait = max_wait_ms / 1000
        self.max_pending = max_pending
        self.batch_sizes: Counter[int] = Counter()  # size -> number of model calls of that size
        self._queue: asyncio.Queue[tuple[Item, asyncio.Future[Result]]] = asyncio.Queue()
        # one thread: batches run one after another, each using all the cores onnxruntime is given
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="batch")
        self._worker: asyncio.Task[None] | None = None
        self._arriving = 0  # requests being read or decoded: items that may join the next batch

    def start(self) -> None:
        self._worker = asyncio.get_running_loop().create_task(self._work(), name="batcher")

    async def stop(self) -> None:
        """Cancel the worker; items still queued fail with CancelledError. Waits for a running batch."""
        if self._worker is not None:
            self._worker.cancel()
            await asyncio.gather(self._worker, return_exceptions=True)
        while not self._queue.empty():
            self._queue.get_nowait()[1].cancel()
        self._executor.shutdown(wait=True)

    @property
    def pending(self) -> int:
        return self._queue.qsize()

    @contextmanager
    def arriving(self) -> Iterator[None]:
        """Announce an item while it is being prepared, so that a batch being gathered waits for it."""
        self._arriving += 1
        try:
            yield
        finally:
            self._arriving -= 1

    async def submit(self, item: Item) -> Result:
        """The result of `item`, computed in some batch; raises Overloaded when the queue is full."""
        if self._queue.qsize() >= self.max_pending:
            raise Overloaded(f"{self._queue.qsize()} requests are already waiting")
        future: asyncio.Future[Result] = asyncio.get_running_loop().create_future()
        self._queue.put_nowait((item, future))
        return await future

    async def _work(self) -> None:
        while True:
            batch = await self._gather()
            batch = [(item, f) for item, f in batch if not f.done()]  # clients that went away
            if batch:
                await self._run(batch)

    async def _gather(self) -> list[tuple[Item, asyncio.Future[Result]]]:
        loop = asyncio.get_running_loop()
        batch = [await self._queue.get()]
        deadline = loop.time() + self.max_wait
        while len(batch) < self.max_batch_size:
            if not self._queue.empty():  # what is already here costs no wait
                batch.append(self._queue.get_nowait())
                continue
            remaining = deadline - loop.time()
            if remaining <= 0 or not self._arriving:  # nothing on its way: waiting only adds latency
                break
            try:
                batch.append(await asyncio.wait_for(self._queue.get(), remaining))
            except asyncio.TimeoutError:  # not the builtin TimeoutError before Python 3.11
                break
        return batch

    async def _run(self, batch: list[tuple[Item, asyncio.Future[Result]]]) -> None:
        items = [item for item, _ in batch]
        self.batch_sizes[len(items)] += 1
        try:
            results = await asyncio.get_running_loop().run_in_executor(self._executor, self.run, items)
        except asyncio.CancelledError:  # shutting down: the batch's requests get no answer
            for _, future in batch:
                future.cancel()
            raise
        except Exception as error:  # every request of the batch answers it; the service goes on
            log.exception("A batch of %d failed", len(items))
            for _, future in batch:
                if not future.done():
                    future.set_exception(error)
            return
        for (_, future), result in zip(batch, results, strict=True):
            if not future.done():
                future.set_result(result)
