"""Client JSON values on their way into the database: one check and encoding for all.

Every JSON value a client hands coordd to store (a job's payload, result, checkpoint and
gates, a worker's readings, a message's content and metadata, an agent's metadata) goes
through `encode` here, so each is refused the same way, with `bad_request` or
`payload_too_large` naming the field, before anything is written.

Why a nesting cap: coordd would store what msgpack decodes (~900 levels), but what it
stores is read back by other programs, and some stop far earlier: the MCP SDK's
serializer gives up at about 255 levels, so one deep message would crash its reader's
`coordd-mcp` on every redelivery. JSON_DEPTH_MAX is well below every such limit.
"""

from __future__ import annotations

from typing import Any

import msgspec

from coordd import errors

JSON_DEPTH_MAX = 64  # levels of nested arrays/objects in a stored value ([] is 1, [[]] is 2)

_encode_json = msgspec.json.encode


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


def encode(what: str, value: Any, cap: int) -> str:
    """Check `value` (nesting, JSON types, size) and return its compact JSON text.

    Args:
        what: the field's name, for the error message.
        value: the decoded value from the request.
        cap: the most bytes its JSON may take.

    Raises:
        errors.BadRequest: nested deeper than JSON_DEPTH_MAX, or not JSON-compatible
            (e.g. an integer outside 64 bits).
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
    return raw.decode()
