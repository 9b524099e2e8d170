"""docs/reference/protocol.md: the wire protocol, from the code. Framing and envelope
(constants from coordd.net.frames, coordd.net.rpc, coordd.net.budgets), the error codes
(coordd.errors), and every RPC method the daemon dispatches: its params Struct (the
method's entry in coordd.wire.protocol.PARAMS), its result Struct (the return annotation of
the Coordinator's handler) and its error codes (the handler's `Raises:`)."""

from __future__ import annotations

import inspect
import os
import re
import tempfile
import typing
from typing import Any

import msgspec

from coordd import client, errors
from coordd.net import budgets
from coordd.net import frames
from coordd.wire import protocol
from coordd.net import rpc
from coordd.clock import SystemClock
from coordd.config import Config
from coordd.wire.enrol import ENROL_OPEN_METHODS
from coordd.daemon.server import sqlite_coordinator
from docgen import md

LEASE_ERRORS = ("not_found", "already_completed", "lease_lost", "lease_expired")
"""What a handler's docstring means by "the lease errors" (coordd.rules.transitions.fence)."""
ANY_METHOD = ("bad_request", "unknown_method", "overloaded", "unavailable", "internal")
"""Codes any call may get: params that do not decode, a method this coordd does not
serve, a full queue or shutdown, storage that refused the write, a bug."""


def handlers() -> dict[str, Any]:
    """Method -> the function that serves it on SQLite: what the daemon dispatches
    (coordd.daemon.server.Daemon calls `getattr(coordinator, method)`)."""
    with tempfile.TemporaryDirectory() as tmp:  # built, never started: nothing is opened
        coord = sqlite_coordinator(os.path.join(tmp, "coordd.db"), Config(),
                                   SystemClock())
        return {m: getattr(getattr(coord, m), "__func__", getattr(coord, m))
                for m in protocol.PARAMS if hasattr(coord, m)}


def result_type(func: Any) -> Any:
    """The handler's return annotation."""
    return typing.get_type_hints(func).get("return")


def error_codes(func: Any, funcs: dict[str, Any]) -> list[str]:
    """The wire codes a handler's docstring says it raises (its `Raises:` text, class
    names mapped through coordd.errors; "as `enqueue`" borrows that method's)."""
    doc = inspect.getdoc(func) or ""
    text = doc[doc.find("Raises"):] if "Raises" in doc else ""
    codes: list[str] = []
    borrowed = re.search(r"Raises as `(\w+)`", text)
    if borrowed and borrowed.group(1) in funcs:
        codes += error_codes(funcs[borrowed.group(1)], funcs)
    if "lease errors" in text:
        codes += LEASE_ERRORS
    by_name = {cls.__name__: code for code, cls in errors.ERROR_CODES.items()}
    for name in re.findall(r"\b([A-Z]\w+)\b", text):
        if name in by_name and by_name[name] != "internal":
            codes.append(by_name[name])
    return list(dict.fromkeys(codes))


def reachable(roots: list[Any]) -> list[type[msgspec.Struct]]:
    """Every Struct named by the roots' types, their fields' types, and so on."""
    seen: dict[type, None] = {}

    def walk(tp: Any) -> None:
        if isinstance(tp, type) and issubclass(tp, msgspec.Struct):
            if tp in seen:
                return
            seen[tp] = None
            for f in msgspec.structs.fields(tp):
                walk(f.type)
        for arg in typing.get_args(tp):
            walk(arg)

    for root in roots:
        walk(root)
    return sorted(seen, key=lambda t: t.__name__)


def anchor(cls: type) -> str:
    return f"type-{cls.__name__.lower()}"


def link(cls: type) -> str:
    return f"[{cls.__name__}](#{anchor(cls)})"


def fields_table(cls: type[msgspec.Struct]) -> str:
    fields = msgspec.structs.fields(cls)
    if not fields:
        return "No fields (an empty map).\n"
    notes = md.field_notes(cls)
    rows = [[md.code(f.encode_name), md.type_text(f.type, link), md.code(md.default_text(f)),
             notes.get(f.name, "")] for f in fields]
    return md.table(["field", "type", "default", "meaning"], rows)


def framing() -> str:
    return f"""\
## Framing

Every message, either way, is one **frame**: a {frames.HEADER.size}-byte big-endian unsigned
length N, then N bytes of [msgpack](https://msgpack.org). The same frames travel over the
Unix socket and over the TLS listener (`listen_tcp`, mutual TLS 1.3); the enrolment listener
(`listen_enroll`) serves only {", ".join(md.code(m) for m in sorted(ENROL_OPEN_METHODS))}.

- **Size cap.** `max_frame_bytes` (default {protocol.MAX_FRAME_DEFAULT} bytes,
  {protocol.MAX_FRAME_DEFAULT >> 20} MiB) bounds requests and replies alike. A request whose
  length prefix is over it is answered `payload_too_large` (id 0) and the connection is
  closed without reading the body. A reply that would be over it is sent as a
  `payload_too_large` error for that id instead ("ask for less").
- **Not our protocol.** A body that is not a request envelope (below), or is nested too deep
  to decode, gets one `bad_request` reply (id 0) and the connection is closed. Inside a
  valid envelope, params that do not decode or an unknown method get an error reply and the
  connection stays open.
- **Many requests at once.** A connection may send requests without waiting; replies come
  back in any order, matched by `id`. Up to {rpc.INFLIGHT_PER_CONNECTION} requests of one
  connection run at once; past that, or while its replies are not being read, coordd reads
  on only {rpc.READ_AHEAD_BYTES // 1024} KiB ahead and then stops reading from it, so a slow
  peer stalls only itself.
- **Budgets.** A frame must arrive whole within `frame_timeout_s` of its first byte, or the
  connection is closed. Frames over {budgets.SMALL_FRAME_BYTES // 1024} KiB count against
  `max_inbound_bytes` (all connections together) while they arrive; past it the frame is
  refused `overloaded` and its connection closed. Replies held unsent for a peer that does
  not read are bounded by `max_unsent_bytes` (per connection) and `max_outbound_bytes`
  (in all): past either, a reply over {budgets.SMALL_FRAME_BYTES // 1024} KiB becomes an
  `overloaded` error; a peer that reads none of its replies for `write_stall_timeout_s` is
  dropped. (Keys in the [configuration reference](configuration.md).)
- **End of a connection.** A peer that half-closes (EOF) still gets the replies to its
  requests in flight (the flush is cut off after {rpc.FLUSH_TIMEOUT_S:g} s). Its parked
  calls (`claim` with `wait_s`, `wait_job`, `watch_*`) are answered at once.
- **Shutdown.** A stopping coordd answers new requests `overloaded` ("coordd is shutting
  down"), lets those in flight finish, answers every parked call, then closes.
- **Who may call.** On the Unix socket the peer's uid/gid comes from `SO_PEERCRED`; admin
  methods (marked below) need a uid or gid in `admin_uids` / `admin_gids` (default: root and
  coordd's own uid). On TLS the worker id is the client certificate's URI SAN
  `coordd-worker://ID` (a request naming another `worker_id` is `permission_denied`) and
  admin methods need a `coordd-admin://NAME` certificate.

## Envelope

A request is a map `{{"id": int, "method": str, "params": map}}`; its reply is
`{{"id": int, "result": ...}}` or `{{"id": int, "error": {{"code": str, "message": str}}}}`,
with the request's `id`. Times are Unix seconds (float), durations are seconds, job ids
are strings. A worker times its lease on its own monotonic clock, from when it *sent* the
claim or renew; `expires_at` is coordd's clock, for display.

### Request

{fields_table(protocol.Request)}
`params` is a map decoded by the method's params Struct (below); a missing `params` is an
empty map.

### Reply

{fields_table(protocol.Reply)}
`error` is an [ErrorBody](#type-errorbody): `{{"code": str, "message": str}}`.

### Schema evolution

Evolution rules: new fields get defaults and go last; a field's type never changes; unknown
fields are ignored (wire Structs never forbid them), so an older coordd accepts a newer
client's requests and the other way round.
"""


EXAMPLE = """\
## Example: one call by hand

What a client in any language does: connect, write one frame, read one frame. This block
(run by the documentation tests) asks `status` over coordd's socket (`$COORDD_SOCKET`, else
the per-user default, found as every coordd program finds it), then asks for a job that
does not exist and gets the `not_found` error reply.

<!-- runnable -->
```bash
python3 - <<'PY'
import socket, struct
import msgspec  # any msgpack library will do
from coordd.paths import default_socket_path  # $COORDD_SOCKET, else the per-user socket

def call(sock, req_id, method, params):
    body = msgspec.msgpack.encode({"id": req_id, "method": method, "params": params})
    sock.sendall(struct.pack(">I", len(body)) + body)
    head = sock.recv(4, socket.MSG_WAITALL)
    (length,) = struct.unpack(">I", head)
    return msgspec.msgpack.decode(sock.recv(length, socket.MSG_WAITALL))

with socket.socket(socket.AF_UNIX) as s:
    s.connect(str(default_socket_path()))
    reply = call(s, 1, "status", {})
    assert reply["id"] == 1 and "waiting" in reply["result"]["jobs"], reply
    reply = call(s, 2, "get_job", {"job_id": "0000000000000000"})
    assert reply["error"]["code"] == "not_found", reply
    print(reply)
PY
```
"""


def error_section() -> str:
    """The error codes, in coordd.wire.protocol.ERROR_CODES order, each with its class's doc."""
    rows = []
    for code in protocol.ERROR_CODES:
        cls = errors.ERROR_CODES.get(code)
        text = ("An unexpected error in coordd (logged there)." if code == "internal"
                else md.first_line(cls.__doc__ if cls else ""))
        rows.append([md.code(code), text])
    return (
        "## Error codes\n\n"
        "Stable strings clients branch on (`coordd.errors` has one class per code). "
        "`overloaded` and `unavailable` are retryable: nothing was stored. A client library "
        "may add its own, never sent by coordd (the Python client: "
        f"{md.code(client.Disconnected.code)}, {md.code(client.CallTimeout.code)}).\n\n"
        + md.table(["code", "meaning"], rows)
        + "\n**The lease errors** of a lease holder's call (`renew`, `checkpoint`, `complete`,"
        " `fail`, `release`, `log_append`, `artifact_*`): "
        + ", ".join(md.code(c) for c in LEASE_ERRORS)
        + ". `already_completed` means the result is stored: treat it as success.\n\n"
        "Any call may also get " + ", ".join(md.code(c) for c in ANY_METHOD)
        + "; an admin method called by someone outside the admin set gets "
        "`permission_denied`.\n\n")


def method_section(method: str, params: type[msgspec.Struct], func: Any,
                   funcs: dict[str, Any]) -> str:
    result = result_type(func)
    about = md.summary(params.__doc__)
    if not about.startswith(f"`{method}`") or params in (protocol.Empty,):
        about = md.summary(func.__doc__)
    marks = []
    if method in protocol.ADMIN_METHODS:
        marks.append("admin")
    codes = error_codes(func, funcs)
    return (f"### `{method}`\n\n" + (f"*{', '.join(marks)}*\n\n" if marks else "")
            + f"{about}\n\n"
            + f"**Params** ({link(params)}):\n\n" + fields_table(params)
            + f"\n**Result**: {md.type_text(result, link)}\n\n"
            + ("**Errors**: " + ", ".join(md.code(c) for c in codes) + "\n\n" if codes else ""))


def render() -> str:
    """The whole page."""
    funcs = handlers()
    methods = sorted(funcs)
    summary_rows = [[f"[{md.code(m)}](#{m})", link(protocol.PARAMS[m]),
                     md.type_text(result_type(funcs[m]), link),
                     "admin" if m in protocol.ADMIN_METHODS else ""] for m in methods]
    types = reachable([protocol.Request, protocol.Reply, protocol.Readings]
                      + [protocol.PARAMS[m] for m in methods]
                      + [result_type(funcs[m]) for m in methods])
    return (
        md.header("Wire protocol", "coordd/protocol*.py, coordd/errors.py and the "
                  "Coordinator's handlers",
                  "How any program, in any language, talks to coordd: frames of msgpack "
                  "over a Unix socket (or mutual TLS), a request envelope, a reply "
                  "envelope, stable error codes, and the methods. The Python client "
                  "([reference](client.md)) wraps all of it.")
        + framing() + "\n" + EXAMPLE + "\n" + error_section()
        + "## Methods\n\n"
        "*admin*: limited to the admin set. Every method is served on both stores (SQLite "
        "and PostgreSQL); `backup` on PostgreSQL answers `invalid_state`, naming pg_dump.\n\n"
        + md.table(["method", "params", "result", ""], summary_rows) + "\n"
        + "".join(method_section(m, protocol.PARAMS[m], funcs[m], funcs) for m in methods)
        + "## Types\n\nEvery Struct a method's params or result names, by name. Fields with "
        "a default may be left out of a request.\n\n"
        + "".join(f"### {t.__name__} {{#{anchor(t)}}}\n\n{md.summary(t.__doc__)}\n\n"
                  + fields_table(t) + "\n" for t in types))
