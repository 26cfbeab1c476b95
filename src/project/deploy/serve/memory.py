"""Giving the memory of freed request bodies back to the system (glibc; elsewhere these do nothing).

glibc keeps freed memory for reuse: large blocks come from mmap only below a threshold that it
raises to the size of each such block freed (up to 32 MiB), and the 64 kB chunks a body arrives in
fragment its heaps. After a burst of large bodies the service stayed 80-110 MB larger than
before it. A fixed threshold keeps every whole body a mapping of its own, unmapped when freed,
and `malloc_trim` hands back the free pages of the heaps once the bodies are gone.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter
log = logging.getLogger("uvicorn.error")


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
