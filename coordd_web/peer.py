"""Who is on the other end of a loopback TCP connection: the peer socket's owner uid,
asked of the kernel by its 4-tuple (netlink sock_diag, ~15 us), else read from
/proc/net/tcp and /proc/net/tcp6 (a walk of the whole TCP hash table: milliseconds).

Rule: look it up on every request (a (host, port) pair is reused by other connections,
so nothing is cached), and when it cannot be found, refuse: PeerUnknown, never a guess.
"""

from __future__ import annotations

import ipaddress
import socket
import struct
from collections.abc import Iterable

PROC_TCP = "/proc/net/tcp"
PROC_TCP6 = "/proc/net/tcp6"
NO_OWNER_STATES = frozenset({"06", "0C"})  # TIME_WAIT, NEW_SYN_RECV: no socket, uid 0
NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
NLMSG_ERROR = 2
NLM_F_REQUEST = 1
DIAG_TIMEOUT_S = 1.0
_NLMSGHDR = struct.Struct("=IHHII")
_DIAG_UID_AT = _NLMSGHDR.size + 64  # inet_diag_msg: family..retrans, sockid (48), 3 u32


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


def diag_uid(client: tuple[str, int], server: tuple[str, int]) -> int | None:
    """The owner of the live socket at `client` connected to `server`, asked of the
    kernel by its 4-tuple (sock_diag); None when the kernel does not say (no netlink, no
    tcp_diag, no such live socket): then ask /proc."""
    try:
        c_ip = ipaddress.ip_address(client[0].split("%", 1)[0])
        s_ip = ipaddress.ip_address(server[0].split("%", 1)[0])
        if c_ip.version != s_ip.version:
            return None
        family = socket.AF_INET6 if c_ip.version == 6 else socket.AF_INET
        req = (struct.pack("=BBBBI", family, socket.IPPROTO_TCP, 0, 0, 0xFFFFFFFF)
               + struct.pack("!HH", int(client[1]), int(server[1]))
               + c_ip.packed.ljust(16, b"\0") + s_ip.packed.ljust(16, b"\0")
               + struct.pack("=III", 0, 0xFFFFFFFF, 0xFFFFFFFF))  # any if, no cookie
        with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_SOCK_DIAG) as nl:
            nl.settimeout(DIAG_TIMEOUT_S)
            nl.sendall(_NLMSGHDR.pack(_NLMSGHDR.size + len(req), SOCK_DIAG_BY_FAMILY,
                                      NLM_F_REQUEST, 1, 0) + req)
            data = nl.recv(8192)
    except (OSError, ValueError, TypeError, IndexError, struct.error):
        return None
    if len(data) < _DIAG_UID_AT + 4:
        return None
    _, kind, _, _, _ = _NLMSGHDR.unpack_from(data)
    state = data[_NLMSGHDR.size + 1]
    if kind != SOCK_DIAG_BY_FAMILY or f"{state:02X}" in NO_OWNER_STATES:
        return None
    return int(struct.unpack_from("=I", data, _DIAG_UID_AT)[0])


def tcp_peer_uid(client: tuple[str, int], server: tuple[str, int]) -> int:
    """The uid owning the socket at `client` connected to `server` (both (host, port), as
    in an ASGI scope): asked of the kernel (diag_uid), else found in this network
    namespace's /proc TCP tables.

    Raises: PeerUnknown (not an IP connection, a table unreadable, no such socket, or
    two owners).
    """
    uid = diag_uid(client, server)
    if uid is not None:
        return uid
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
