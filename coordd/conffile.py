"""Reading an operator's config file (coordd's, the worker's, a SIGHUP's re-read, the
worker's `--readings-override` on every heartbeat).

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


class ConfigFileMissing(ConfigFileError):
    """There is no file at the path (ENOENT)."""


def read(path: str | os.PathLike[str], max_bytes: int = MAX_BYTES,
         what: str = "a config file") -> str:
    """The text of the config file at `path`: a regular file of at most `max_bytes`, UTF-8.

    Opened with O_NONBLOCK, so a FIFO or device is refused instead of waited on. `what`
    names the file in the too-large message.

    Raises:
        ConfigFileMissing: there is no such file.
        ConfigFileError: it cannot be opened (the OS's reason), is not a regular file, is
            over `max_bytes`, or is not UTF-8.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError as exc:
        raise ConfigFileMissing(exc.strerror or str(exc)) from exc
    except OSError as exc:
        raise ConfigFileError(exc.strerror or str(exc)) from exc
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ConfigFileError("not a regular file")
        chunks, size = [], 0
        while size <= max_bytes:
            chunk = os.read(fd, max_bytes + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as exc:
        raise ConfigFileError(exc.strerror or str(exc)) from exc
    finally:
        os.close(fd)
    if size > max_bytes:
        raise ConfigFileError(f"over {max_bytes} bytes, too large for {what}")
    try:
        return b"".join(chunks).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigFileError(f"not UTF-8 text ({exc.reason} at byte {exc.start})") from exc
