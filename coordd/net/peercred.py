"""Who is on the other end of a Unix socket: SO_PEERCRED (moved out of coordd.net.rpc for
that module's size; coordd.net.rpc re-exports it)."""

from __future__ import annotations

import socket
import struct


class PeerCred:
    """The connecting process's pid/uid/gid, from SO_PEERCRED. `worker_id` is None here;
    a TCP peer (coordd.net.tls.TlsPeer) carries its certificate's worker id."""

    worker_id: str | None = None
    methods: frozenset[str] | None = None  # None: every method (the admin rule aside)

    def __init__(self, pid: int, uid: int, gid: int) -> None:
        self.pid, self.uid, self.gid = pid, uid, gid

    def __repr__(self) -> str:
        return f"uid {self.uid}"

    @classmethod
    def of(cls, sock: socket.socket | None) -> "PeerCred":
        """Read SO_PEERCRED of a connected Unix socket (uid -1 when unavailable)."""
        if sock is None:
            return cls(0, -1, -1)
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        return cls(*struct.unpack("3i", raw))
