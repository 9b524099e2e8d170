"""`coordctl msg send|read|broadcast|ack` and `coordctl agents`: the agent message hub.

Names default to `$COORD_AGENT`, else `coordctl:<login>`. Content is sent as a text string
unless `--content-json` says to parse it as JSON (`@FILE` reads it from a file, `@-` from
stdin). `msg read` prints the messages, then acks them (they are not delivered to that
name again); `--keep` leaves them unacked, so they come back after the visibility timeout.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

from rich import box
from rich.console import Console

from coordctl.commands import Outcome, UsageError, parse_json_arg, read_text_arg
from coordctl.render import SafeTable
from coordd.paths import default_agent_name
from coordd.errors import CoordError
from coordd.wire.protocol import AgentsResult, ReadResult

AddCommand = Callable[[str, str], argparse.ArgumentParser]


def add_parsers(cmd: AddCommand, common: Callable[[argparse.ArgumentParser, bool], None]
                ) -> None:
    """Register `msg` (send, read, broadcast) and `agents` with coordctl's parser."""
    m = cmd("msg", "agent messages: send, read, broadcast")
    sub = m.add_subparsers(dest="msg_command", required=True, metavar="ACTION")

    def action(name: str, help_: str) -> argparse.ArgumentParser:
        sp = sub.add_parser(name, help=help_, description=help_)
        common(sp, True)
        return sp

    for name, help_ in (("send", "send a message to one agent"),
                        ("broadcast", "send a message every other agent reads once")):
        sp = action(name, help_)
        sp.add_argument("--from", dest="sender", metavar="NAME",
                        help="sender name (default: $COORD_AGENT or coordctl:<login>)")
        if name == "send":
            sp.add_argument("--to", dest="recipient", metavar="NAME", required=True,
                            help="the recipient agent's name")
        sp.add_argument("content", metavar="CONTENT", help="text, or @FILE / @- for stdin")
        sp.add_argument("--content-json", action="store_true",
                        help="parse CONTENT as JSON instead of sending it as text")
        sp.add_argument("--type", dest="message_type", default="text", metavar="TYPE",
                        help="a label the reader can branch on (default: text)")
        sp.add_argument("--priority", type=int, default=2, metavar="P", help="0 (urgent) .. 3")
        sp.add_argument("--ttl", type=float, metavar="S", help="never delivered after S seconds")
        sp.add_argument("--metadata", metavar="JSON|@FILE", help="a JSON object")
        sp.add_argument("--id", dest="message_id", metavar="ID",
                        help="your own message id: a resend with it is stored once")
    r = action("read", "read (and ack) an agent's messages, P0 first then oldest first")
    r.add_argument("--as", dest="reader", metavar="NAME",
                   help="whose inbox (default: $COORD_AGENT or coordctl:<login>)")
    r.add_argument("--limit", type=int, default=10, metavar="N", help="1..100 (default 10)")
    r.add_argument("--keep", action="store_true",
                   help="do not ack: the messages come back after the visibility timeout")
    r.add_argument("--visibility", type=float, metavar="S", dest="visibility_s",
                   help="seconds they stay hidden with --keep (default: coordd's)")
    k = action("ack", "ack messages read with --keep: they are not delivered again")
    k.add_argument("message_ids", metavar="ID", nargs="+", help="message ids to ack")
    k.add_argument("--as", dest="reader", metavar="NAME",
                   help="whose deliveries (default: $COORD_AGENT or coordctl:<login>)")
    a = cmd("agents", "agents that reported a status (update_agent_status), with heartbeat "
                      "age and unread messages")
    a.add_argument("name", metavar="NAME", nargs="?", help="only this agent")
    a.add_argument("--limit", type=int, default=100, metavar="N",
                   help="agents per page, 1..1000 (default 100)")
    a.add_argument("--after", metavar="NAME", help="the page after this agent name")


def _send_fields(args: argparse.Namespace) -> dict[str, Any]:
    if args.content_json:
        content = parse_json_arg(args.content, "CONTENT")
    else:
        content = read_text_arg(args.content, "CONTENT")
    fields: dict[str, Any] = {"content": content, "message_type": args.message_type,
                              "priority": args.priority}
    for key in ("ttl", "message_id"):
        if getattr(args, key) is not None:
            fields["ttl_s" if key == "ttl" else key] = getattr(args, key)
    if args.metadata is not None:
        fields["metadata"] = parse_json_arg(args.metadata, "--metadata")
    return fields


def _name(given: str | None, what: str) -> str:
    """An explicit name, else the default one; an explicitly empty name is refused."""
    if given is None:
        return default_agent_name("coordctl")
    if not given:
        raise UsageError(f"{what} must not be empty")
    return given


def msg(client: Any, args: argparse.Namespace) -> Outcome:
    """`msg send|broadcast|read|ack`."""
    if args.msg_command == "read":
        return _read(client, args)
    if args.msg_command == "ack":
        res = client.ack_messages(_name(args.reader, "--as"), args.message_ids)
        return Outcome(res, f"acked {res.acked} message(s)")
    sender = _name(args.sender, "--from")
    if args.msg_command == "send":
        res = client.send_message(sender, args.recipient, **_send_fields(args))
    else:
        res = client.broadcast(sender, **_send_fields(args))
    return Outcome(res, res.message_id)


def _read(client: Any, args: argparse.Namespace) -> Outcome:
    reader = _name(args.reader, "--as")
    fields: dict[str, Any] = {"limit": args.limit}
    if args.visibility_s is not None:
        fields["visibility_s"] = args.visibility_s
    res: ReadResult = client.read_messages(reader, **fields)
    ids = [] if args.keep else [m.message_id for m in res.messages]
    # printed first, acked after: output that cannot be written leaves them unacked, and
    # they come back after the visibility timeout (at least once, as for any reader)
    held = None if res.messages else _held(client, reader)
    data = {"reader": reader, "messages": res.messages, "acked": len(ids),
            "visible_until": None if ids else res.visible_until, "held": held}
    return Outcome(data, lambda con: _messages(con, reader, res, len(ids), held),
                   after=(lambda: client.ack_messages(reader, ids)) if ids else None)


def _held(client: Any, reader: str) -> int | None:
    """How many of `reader`'s messages are read and not acked, hidden until their
    visibility timeout (the agent's unread count when nothing was delivered); None when
    `reader` never reported a status (no count is kept for it)."""
    try:
        found = client.get_agent_status(reader).agents
    except CoordError:
        return None
    return found[0].unread if found else None


def agents(client: Any, args: argparse.Namespace) -> Outcome:
    """`agents [NAME]`: every agent (or one) with status, heartbeat age and unread count."""
    page = {} if args.name else {"limit": args.limit, "after": args.after}
    res: AgentsResult = client.get_agent_status(args.name, **page)
    return Outcome(res, lambda con: _agents(con, res))


def _messages(con: Console, reader: str, res: ReadResult, acked: int,
              held: int | None = None) -> None:
    from coordctl.render import fmt_time
    if not res.messages:
        if held:
            con.print(f"no messages to deliver to {reader} now: {held} read and not acked "
                      f"(after a --keep read they come back when their visibility timeout "
                      f"ends; `coordctl msg ack --as {reader} ID...` acks them)")
        else:
            con.print(f"no messages for {reader}" + ("" if held == 0 else
                      " (messages read with --keep and not acked stay hidden until their "
                      "visibility timeout ends)"))
        return
    t = SafeTable(box=box.SIMPLE_HEAD, show_edge=False)
    for col in ("id", "from", "to", "type", "prio", "sent", "n", "content"):
        t.add_column(col, no_wrap=col != "content", overflow="fold")
    for m in res.messages:
        content = m.content if isinstance(m.content, str) else json.dumps(m.content)
        t.add_row(m.message_id, m.sender, m.recipient or "(all)", m.message_type,
                  f"P{m.priority}", fmt_time(m.created_at), str(m.deliveries), content)
    con.print(t)
    con.print(f"{len(res.messages)} message(s); "
              + (f"{acked} acked" if acked else f"not acked: back after {fmt_time(res.visible_until)}"))


def _agents(con: Console, res: AgentsResult) -> None:
    from coordctl.render import fmt_age
    t = SafeTable(box=box.SIMPLE_HEAD, show_edge=False)
    for col in ("agent", "status", "live", "heartbeat", "unread", "metadata"):
        t.add_column(col, no_wrap=col != "metadata", overflow="fold")
    for a in res.agents:
        t.add_row(a.name, a.status, "yes" if a.live else "no", fmt_age(a.heartbeat_age_s) + " ago",
                  str(a.unread), json.dumps(a.metadata) if a.metadata else "")
    con.print(t)
    more = f"; more after --after {res.next_after}" if res.next_after else ""
    con.print(f"{len(res.agents)} agent(s){more}" if res.agents else
              "no agents: an agent is listed once it reports a status (update_agent_status)")


MSG_COMMANDS: dict[str, Callable[[Any, argparse.Namespace], Outcome]] = {
    "msg": msg, "agents": agents}
"""Subcommand name -> implementation (merged into coordctl's table)."""
