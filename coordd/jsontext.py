"""Stored JSON text: encode, decode, and decode for display (pure; every store and every
rule that reads a stored JSON column uses these; coordd.rules.values checks a client's values
before they are stored)."""

from __future__ import annotations

from typing import Any

import msgspec

json_encode = msgspec.json.encode
json_decode = msgspec.json.decode
UNDECODABLE_SHOWN_CHARS = 200  # what lenient_json shows of stored text that does not decode


def dumps(value: Any) -> str:
    """Encode a JSON-compatible value as compact JSON text."""
    return json_encode(value).decode()


def maybe_json(text: str | None) -> Any:
    """Decode JSON text, or None for None. Raises: msgspec.DecodeError."""
    return None if text is None else json_decode(text)


def lenient_json(text: str | None, default: Any = None) -> Any:
    """Decode stored JSON for display; what does not decode is shown, never raised."""
    if text is None:
        return default
    try:
        return json_decode(text)
    except msgspec.DecodeError:
        if default is not None:
            return default
        shown = (text if isinstance(text, str) else repr(text))[:UNDECODABLE_SHOWN_CHARS]
        return {"undecodable": shown}
