"""Frames on the wire: a 4-byte big-endian length, then that many bytes of msgpack.

Shared by the daemon's RPC layer (coordd.net.rpc, coordd.net.budgets) and the client.
"""

from __future__ import annotations

import asyncio
import struct
from typing import Any

import msgspec

from coordd import errors

HEADER = struct.Struct(">I")
_encoder = msgspec.msgpack.Encoder()


class FrameTooLarge(errors.PayloadTooLarge):
    """A frame's length prefix is over the cap."""


def encode_frame(obj: Any, max_frame: int | None = None, what: str = "frame") -> bytes:
    """Encode `obj` as msgpack with its 4-byte big-endian length prefix.

    Raises:
        FrameTooLarge: `max_frame` is given and the body is over it.
    """
    body = _encoder.encode(obj)
    if max_frame is not None and len(body) > max_frame:
        raise FrameTooLarge(f"{what} of {len(body)} bytes is over the {max_frame}-byte frame cap")
    return HEADER.pack(len(body)) + body


async def read_frame(reader: asyncio.StreamReader, max_frame: int) -> bytes | None:
    """Read one frame body; None on a clean EOF between frames.

    Raises:
        FrameTooLarge: the length prefix is over `max_frame` (the body is not read).
        asyncio.IncompleteReadError: the peer went away mid-frame.
    """
    try:
        head = await reader.readexactly(HEADER.size)
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            return None
        raise
    (length,) = HEADER.unpack(head)
    if length > max_frame:
        raise FrameTooLarge(f"frame of {length} bytes is over the {max_frame}-byte cap")
    return await reader.readexactly(length)
