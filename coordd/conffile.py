"""Reading an operator's config file (coordd's, the worker's, a SIGHUP's re-read).

The file is read without ever blocking and within a size cap: a path that became a FIFO,
a device or a huge file must not hang or stall coordd's event loop (SIGHUP re-reads it
there), and bytes that are not UTF-8 are a one-line error, not a traceback.
"""

from __future__ import annotations

import os
import stat

MAX_BYTES = 1 << 20
"""The largest config file read (bytes); real ones are a few KiB."""


class ConfigFileError(Exception):
    """The file cannot be read as a config: the message says why, in one line."""


def read(path: str | os.PathLike[str]) -> str:
    """The text of the config file at `path`: a regular file of at most MAX_BYTES, UTF-8.

    Opened with O_NONBLOCK, so a FIFO or device is refused instead of waited on.

    Raises:
        ConfigFileError: it cannot be opened (the OS's reason), is not a regular file, is
            over MAX_BYTES, or is not UTF-8.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as exc:
        raise ConfigFileError(exc.strerror or str(exc)) from exc
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ConfigFileError("not a regular file")
        chunks, size = [], 0
        while size <= MAX_BYTES:
            chunk = os.read(fd, MAX_BYTES + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as exc:
        raise ConfigFileError(exc.strerror or str(exc)) from exc
    finally:
        os.close(fd)
    if size > MAX_BYTES:
        raise ConfigFileError(f"over {MAX_BYTES} bytes, too large for a config file")
    try:
        return b"".join(chunks).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigFileError(f"not UTF-8 text ({exc.reason} at byte {exc.start})") from exc
