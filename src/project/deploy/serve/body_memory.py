"""The memory that request bodies and decoded images hold: one budget for all requests, and freeing it.

Per-request limits do not bound the sum: 50 concurrent 19 MB bodies held 3.5 GB. So every request
reserves, before reading, what its Content-Length declares (the most a chunked body may hold, when
it declares nothing), and every image reserves, before any pixel is decoded, what decoding it will
hold (from its header: a 286 KB animated WebP took 827 MB). What does not fit is refused with 503;
what fits is given back when the request is answered.

Giving it back to the system (glibc; elsewhere these do nothing): glibc keeps freed memory for
reuse. Large blocks come from mmap only below a threshold that it raises to the size of each such
block freed (up to 32 MiB), and the 64 kB chunks a body arrives in fragment its heaps. After a
burst of large bodies the service stayed 80-110 MB larger than before it. A fixed threshold keeps
every whole body a mapping of its own, unmapped when freed, and `malloc_trim` hands back the free
pages of the heaps once the bodies are gone.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util

from project.deploy.serve.bodies import Limits, RequestError

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter


class BodyBudget:
    """Bytes of request bodies and decoded images held at once, summed over all requests; beyond it 503.

    Event-loop only, so no lock.

    Args:
        max_bytes: the most bytes held at once, bodies and decoding images together.
    """

    TRIM_AFTER = 64 * 2**20  # bytes of bodies released before the heaps are trimmed, once none is held

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.held = 0
        self.decoding = 0  # the part of `held` reserved for decoding images
        self.refused = 0
        self._released = 0

    def reserve(self, declared: str, limits: Limits) -> int:
        """Reserve for a body whose Content-Length header is `declared` ("" when absent); the bytes taken."""
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
            asyncio.get_running_loop().run_in_executor(None, trim)


def _libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallopt, libc.malloc_trim  # noqa: B018  # glibc has both; musl and macOS do not
    except (OSError, AttributeError):
        return None
    return libc


LIBC = _libc()


def return_freed_bodies() -> None:
    """Serve large blocks (1 MiB and up) from mmap always, so that freeing them unmaps them."""
    if LIBC is not None:
        LIBC.mallopt(M_MMAP_THRESHOLD, 1 << 20)


def trim() -> None:
    """Hand the free pages of every heap back to the system (a few ms; call off the event loop)."""
    if LIBC is not None:
        LIBC.malloc_trim(0)
