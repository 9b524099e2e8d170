"""Reading an operator's config file (coordd's, the worker's, a SIGHUP's re-read, the
worker's `--readings-override` on every heartbeat).

The file is read without ever blocking and within a size cap: a path that became a FIFO,
a device or a huge file must not hang or stall coordd's event loop (SIGHUP re-reads it
there), and bytes that are not UTF-8 are a one-line error, not a traceback. A validation
error names the table as the file does (`locate`): `[kinds.embed]`, not `$.kinds[...]`.
"""

from __future__ import annotations

import json
import os
import re
import stat
from typing import Any

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


_PATH = re.compile(r"`\$((?:\.\w+|\[\d+\]|\[\.\.\.\])*)`")
_STEP = re.compile(r"\.(\w+)|\[(\d+)\]|\[(\.\.\.)\]")
_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
_TYPES = {"str": str, "int": int, "float": float, "bool": bool, "array": list, "object": dict}


def locate(message: str, data: Any) -> str:
    """msgspec's validation `message` about `data` (the decoded file) in the file's terms.

    msgspec says `$.kinds[...]` for any key of a table, and `$.nodes[1]` for an element
    of an array of tables. The key is found in `data` (the one holding the unknown field,
    or the value of the wrong type), an element that has a `name` is named, and an unknown
    field says which table it is in (or that it is at the top level). A plain path
    (`$.lease_s`) is left as it is.
    """
    unknown = re.match(r"Object contains unknown field `([^`]*)`", message)
    found = _PATH.search(message)
    if found is None:
        return message + (" - at the top level (before any [table])" if unknown else "")
    steps = _STEP.findall(found.group(1))
    if not unknown and not any(wild or index for _f, index, wild in steps):
        return message
    paths = _walk(data, steps)
    got = re.search(r", got `(\w+)`", message)
    fits = [(p, v) for p, v in paths if (
        isinstance(v, dict) and unknown.group(1) in v if unknown else
        got is None or _is(v, got.group(1)))]
    if not fits:
        return message
    said = " or ".join(_toml(p, data, bool(unknown)) for p, _v in fits[:3])
    if not unknown and not any(wild for _f, _i, wild in steps) and "table named" not in said:
        return message  # a plain path (`$.tls_deny_workers[1]`) says it already
    if unknown:
        return message[:found.start()].removesuffix("at ") + f"in {said}" \
            + message[found.end():]
    return message[:found.start()] + said + message[found.end():]


def _walk(data: Any, steps: list[tuple[str, str, str]]) -> list[tuple[list[Any], Any]]:
    """Every (concrete path, value) that `steps` (a msgspec path) can name in `data`."""
    cands: list[tuple[list[Any], Any]] = [([], data)]
    for field, index, wild in steps:
        nxt: list[tuple[list[Any], Any]] = []
        for path, node in cands:
            if field and isinstance(node, dict) and field in node:
                nxt.append((path + [field], node[field]))
            elif index and isinstance(node, list) and int(index) < len(node):
                nxt.append((path + [int(index)], node[int(index)]))
            elif wild and isinstance(node, dict):
                nxt += [(path + [k], v) for k, v in node.items()]
        cands = nxt
    return cands


def _is(value: Any, type_name: str) -> bool:
    want = _TYPES.get(type_name)
    if want is None:
        return True
    if want is int or want is float:
        return isinstance(value, want) and not isinstance(value, bool)
    return isinstance(value, want)


def _toml(path: list[Any], data: Any, table: bool) -> str:
    """How the file names `path`: `[kinds.embed]` (a `table`), `kinds.embed.slots`,
    `nodes[0].priority (the [[nodes]] table named "gather")`."""
    out, names, node = "", [], data
    for step in path:
        parent, node = out, node[step]
        if isinstance(step, int):
            out += f"[{step}]"
            if isinstance(node, dict) and isinstance(node.get("name"), str):
                names.append(f"the [[{parent}]] table named {json.dumps(node['name'])}")
        else:
            key = step if _BARE_KEY.fullmatch(step) else json.dumps(step)
            out += f".{key}" if out else key
    shown = f"[{out}]" if table and not isinstance(path[-1], int) else f"`{out}`"
    return shown + (f" ({', '.join(names)})" if names else "")
