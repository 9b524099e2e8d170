"""Give freed heap memory back to the system after a burst of large buffers.

Large frames and replies (megabytes each) are freed when their connection is served or
dropped, but glibc keeps freed heap pages (in every thread's arena) instead of returning
them, so coordd's RSS stayed at its peak after slow readers left (issue 21, finding 3).
`trim()` calls glibc's malloc_trim(0); elsewhere (musl, macOS) it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

logger = logging.getLogger(__name__)

TRIM_AFTER_BYTES = 64 << 20  # large buffers made since the last trim that warrant one

_malloc_trim = None
try:
    _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    _malloc_trim = _libc.malloc_trim
    _malloc_trim.argtypes = [ctypes.c_size_t]
    _malloc_trim.restype = ctypes.c_int
except (OSError, AttributeError):  # not glibc
    _malloc_trim = None


def trim() -> bool:
    """Return free heap pages to the system (blocking, a few ms; the GIL is released).
    True if memory was released."""
    if _malloc_trim is None:
        return False
    return bool(_malloc_trim(0))
