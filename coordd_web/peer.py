"""Who is on the other end of a loopback TCP connection: the peer socket's owner uid,
read from /proc/net/tcp and /proc/net/tcp6.

Rule: look it up on every request (a (host, port) pair is reused by other connections,
so nothing is cached), and when it cannot be found, refuse: PeerUnknown, never a guess.
"""

from __future__ import annotations

import ipaddress
import struct
from collections.abc import Iterable

PROC_TCP = "/proc/net/tcp"
PROC_TCP6 = "/proc/net/tcp6"
NO_OWNER_STATES = frozenset({"06", "0C"})  # TIME_WAIT, NEW_SYN_RECV: no socket, uid 0


class PeerUnknown(Exception):
    """The owner of a connection's peer socket cannot be found."""


def _hex(addr: ipaddress.IPv4Address | ipaddress.IPv6Address, port: int) -> str:
    """`addr:port` as /proc/net/tcp* prints it: each 32-bit word in host order, in hex."""
    raw = addr.packed
    words = struct.unpack(f"={len(raw) // 4}I", raw)
    return "".join(f"{w:08X}" for w in words) + f":{port:04X}"


def _candidates(client: tuple[str, int], server: tuple[str, int]
                ) -> list[tuple[str, str, str]]:
    """(table, peer's local address, peer's remote address) to look for."""
    try:
        c_ip = ipaddress.ip_address(client[0].split("%", 1)[0])
        s_ip = ipaddress.ip_address(server[0].split("%", 1)[0])
        c_port, s_port = int(client[1]), int(server[1])
    except (ValueError, TypeError, IndexError) as exc:
        raise PeerUnknown(f"not a TCP connection ({client!r} -> {server!r})") from exc
    out = []
    if c_ip.version == 6 and s_ip.version == 6:
        out.append((PROC_TCP6, _hex(c_ip, c_port), _hex(s_ip, s_port)))
        c4, s4 = c_ip.ipv4_mapped, s_ip.ipv4_mapped  # an IPv4 client of a dual-stack socket
        if c4 is not None and s4 is not None:
            out.append((PROC_TCP, _hex(c4, c_port), _hex(s4, s_port)))
    elif c_ip.version == 4 and s_ip.version == 4:
        out.append((PROC_TCP, _hex(c_ip, c_port), _hex(s_ip, s_port)))
    else:
        raise PeerUnknown(f"mixed address families ({client!r} -> {server!r})")
    return out


def _owners(lines: Iterable[str], local: str, remote: str) -> set[int]:
    found = set()
    for line in lines:
        f = line.split()
        if len(f) > 7 and f[1] == local and f[2] == remote and f[3] not in NO_OWNER_STATES:
            found.add(int(f[7]))
    return found


def tcp_peer_uid(client: tuple[str, int], server: tuple[str, int]) -> int:
    """The uid owning the socket at `client` connected to `server` (both (host, port), as
    in an ASGI scope), found in this network namespace's TCP tables.

    Raises: PeerUnknown (not an IP connection, a table unreadable, no such socket, or
    two owners).
    """
    owners: set[int] = set()
    for table, local, remote in _candidates(client, server):
        try:
            with open(table, encoding="ascii") as f:
                owners |= _owners(f, local, remote)
        except OSError as exc:
            raise PeerUnknown(f"cannot read {table}: {exc.strerror}") from exc
        if owners:
            break
    if not owners:
        raise PeerUnknown(f"no socket {client[0]}:{client[1]} connected to "
                          f"{server[0]}:{server[1]} in {PROC_TCP}")
    if len(owners) > 1:
        raise PeerUnknown(f"{client[0]}:{client[1]} has several owners: {sorted(owners)}")
    return owners.pop()
