"""Client JSON values on their way into the database: one check and encoding for all.

Every JSON value a client hands coordd to store (a job's payload, result, checkpoint and
gates, a worker's readings, a message's content and metadata, an agent's metadata) goes
through `encode` here, so each is refused the same way, with `bad_request` or
`payload_too_large` naming the field, before anything is written.

Non-finite numbers (NaN, +-Infinity) are refused with the path to the first one: msgpack
carries them, but JSON has no spelling for them (msgspec would store them as `null`, and
the value read back would not be the one sent).

Why a nesting cap: coordd would store what msgpack decodes (~900 levels), but what it
stores is read back by other programs, and some stop far earlier: the MCP SDK's
serializer gives up at about 255 levels, so one deep message would crash its reader's
`coordd-mcp` on every redelivery. JSON_DEPTH_MAX is well below every such limit.
"""

from __future__ import annotations

import math
import re
from typing import Any

import msgspec

from coordd import errors

JSON_DEPTH_MAX = 64  # levels of nested arrays/objects in a stored value ([] is 1, [[]] is 2)

_encode_json = msgspec.json.encode
_encode_msgpack = msgspec.msgpack.encode
# msgspec writes every float to msgpack as float64 (0xcb, then 8 bytes big-endian); a NaN
# or an infinity has all exponent bits set. JSON has no way to tell (msgspec writes them
# as null), so a value whose JSON holds a `null` is looked at here: ~1.1x its JSON
# encoding, where a walk of the value in Python took 4-20x (docs/decisions.md).
_NON_FINITE_MSGPACK = re.compile(rb"\xcb[\x7f\xff][\xf0-\xff]")


def check_depth(what: str, value: Any, limit: int = JSON_DEPTH_MAX) -> None:
    """Refuse `value` if its arrays/objects nest deeper than `limit` levels.

    Raises:
        errors.BadRequest: too deep; the message names `what`.
    """
    if not isinstance(value, (list, dict, tuple)):
        return
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            raise errors.BadRequest(
                f"{what} nests deeper than {limit} levels of arrays/objects")
        children = node.values() if isinstance(node, dict) else node
        for child in children:
            if isinstance(child, (list, dict, tuple)):
                stack.append((child, depth + 1))


def check_finite(what: str, value: Any) -> None:
    """Refuse `value` if a number anywhere in it is NaN or infinite.

    Raises:
        errors.BadRequest: naming the path of the first such number, e.g.
            `payload.x[2] is not a finite number (nan)`.
    """
    stack: list[tuple[Any, str]] = [(value, what)]
    while stack:
        node, path = stack.pop()
        if isinstance(node, float):
            if not math.isfinite(node):
                raise errors.BadRequest(f"{path} is not a finite number ({node!r}); JSON "
                                        "has no NaN or Infinity")
        elif isinstance(node, dict):
            stack.extend((v, f"{path}.{k}") for k, v in reversed(node.items()))
        elif isinstance(node, (list, tuple)):
            stack.extend((v, f"{path}[{i}]") for i, v in reversed(list(enumerate(node))))


def encode(what: str, value: Any, cap: int) -> str:
    """Check `value` (nesting, JSON types, size) and return its compact JSON text.

    Args:
        what: the field's name, for the error message.
        value: the decoded value from the request.
        cap: the most bytes its JSON may take.

    Raises:
        errors.BadRequest: nested deeper than JSON_DEPTH_MAX, not JSON-compatible
            (e.g. an integer outside 64 bits), or holding NaN or an infinity.
        errors.PayloadTooLarge: its JSON is over `cap` bytes.
    """
    try:
        raw = _encode_json(value)
    except (TypeError, ValueError, OverflowError, RecursionError, msgspec.EncodeError) as exc:
        raise errors.BadRequest(f"{what} is not JSON-compatible: {exc}") from exc
    if len(raw) > cap:
        raise errors.PayloadTooLarge(f"{what} is {len(raw)} bytes; the cap is {cap}")
    if raw.count(b"[") + raw.count(b"{") > JSON_DEPTH_MAX:  # else it cannot nest that deep
        check_depth(what, value)
    if b"null" in raw and _NON_FINITE_MSGPACK.search(_encode_msgpack(value)):
        check_finite(what, value)  # the path of the first one (or none: a false alarm)
    return raw.decode()


# the numeric readings gates read, and the key that says why one is unknown
READING_REASON_KEYS = {"memory_used_pct": "memory_reason", "temperature_c": "temperature_reason",
                       "user_idle_s": "user_idle_reason", "battery_pct": "battery_reason"}


def unknown_if_not_finite(readings: dict[str, Any]) -> dict[str, Any]:
    """`readings` with each gate reading that is NaN or infinite made unknown (None), its
    `<name>_reason` saying so; the same dict when there is none. Gates then follow their
    explicit policy for unknown readings (a broken sensor is not a crash, nor a refusal of
    the whole heartbeat). Other keys are left for `encode` to refuse."""
    bad = [k for k in READING_REASON_KEYS
           if isinstance(v := readings.get(k), float) and not math.isfinite(v)]
    if not bad:
        return readings
    out = dict(readings)
    for k in bad:
        out[k] = None
        out[READING_REASON_KEYS[k]] = f"the worker sent a non-finite {k} ({readings[k]!r})"
    return out
