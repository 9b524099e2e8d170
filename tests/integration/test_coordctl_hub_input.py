"""coordctl's hub commands against a real coordd with hostile input and output: a stdout
that cannot be written, non-UTF-8 arguments and stdin, numbers and nesting msgpack cannot
carry, and terminal control sequences stored in messages."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from coordd.client import SyncClient
from tests.integration.test_coordctl import ctl, ok, ok_json, refused


def ctl_to(path: str, sock: str, *args: str) -> subprocess.CompletedProcess[bytes]:
    """Run coordctl with stdout opened on `path` (e.g. /dev/full)."""
    with open(path, "wb") as out:
        return subprocess.run([sys.executable, "-m", "coordctl", "--socket", sock, *args],
                              stdout=out, stderr=subprocess.PIPE, timeout=30)


@pytest.mark.parametrize("json_flag", [[], ["--json"]])
def test_msg_read_whose_output_cannot_be_written_acks_nothing(daemon, json_flag):
    """`msg read > /dev/full`: one error line, exit 1, and the message is not acked: it
    comes back after the visibility timeout (the README: prints them, then acks them)."""
    sock = daemon.socket
    mid = ok(ctl(sock, "msg", "send", "--from", "lead", "--to", "pipe", "x" * 10_000)).strip()
    p = ctl_to("/dev/full", sock, *json_flag, "msg", "read", "--as", "pipe",
               "--visibility", "0.3")
    lines = p.stderr.decode().splitlines()
    assert p.returncode == 1 and len(lines) == 1, p.stderr.decode()
    assert lines[0].startswith("coordctl: output: cannot write the output: "), lines
    time.sleep(0.4)
    with SyncClient(sock) as c:
        again = c.read_messages("pipe")
    assert [(m.message_id, m.deliveries) for m in again.messages] == [(mid, 2)]


def test_msg_read_acks_what_it_printed(daemon):
    sock = daemon.socket
    ok(ctl(sock, "msg", "send", "--from", "lead", "--to", "r", "one"))
    out = ok_json(ctl(sock, "--json", "msg", "read", "--as", "r", "--visibility", "0.2"))
    assert [m["content"] for m in out["messages"]] == ["one"] and out["acked"] == 1
    time.sleep(0.3)
    with SyncClient(sock) as c:
        assert c.read_messages("r").messages == []


NON_UTF8 = os.fsdecode(b"\xff")  # what Python makes of a non-UTF-8 argument


@pytest.mark.parametrize("args, stdin", [
    (("msg", "send", "--to", "h", NON_UTF8), None),
    (("msg", "send", "--to", NON_UTF8, "hi"), None),
    (("msg", "broadcast", "--from", NON_UTF8, "hi"), None),
    (("msg", "read", "--as", NON_UTF8), None),
    (("agents", NON_UTF8), None),
    (("msg", "send", "--to", "h", "--metadata", json.dumps({"k": NON_UTF8}), "hi"), None),
    (("msg", "send", "--to", "h", "@-"), b"caf\xe9 \xff\xfe"),
    (("msg", "send", "--to", "h", "--content-json", "@-"), b'"caf\xe9"'),
    (("msg", "send", "--to", "h", "--content-json", "123456789012345678901234567890"), None),
    (("msg", "send", "--to", "h", "--content-json", "[" * 985 + "]" * 985), None),
    (("msg", "send", "--to", "h", "--content-json", "[" * 5000 + "]" * 5000), None),
    (("enqueue", "--kind", "k", "--role", "cpu", "--priority", "1", "--payload",
      '{"n": 1e999999, "m": 99999999999999999999999}'), None),
    (("show", NON_UTF8), None),
])
def test_input_msgpack_cannot_carry_is_a_one_line_usage_error(daemon, args, stdin):
    argv = [sys.executable, "-m", "coordctl", "--socket", daemon.socket, *args]
    p = subprocess.run([os.fsencode(a) for a in argv], capture_output=True, input=stdin,
                       timeout=30)
    err = p.stderr.decode("utf-8", "replace")
    assert p.returncode == 2, (p.returncode, err)
    assert len(err.splitlines()) == 1 and err.startswith("coordctl: usage: "), err
    assert "Traceback" not in err
    with SyncClient(daemon.socket) as c:
        assert c.read_messages("h").messages == [] and c.status().jobs["waiting"] == 0


HOSTILE = "hi \x1b[2J\x1b]0;pwned\x07 \u202eevil\x9b31m\x7f"
CONTROL = ("\x1b", "\x07", "\u202e", "\x9b", "\x7f")


def test_control_characters_from_the_database_are_escaped_in_human_output(daemon, tmp_path):
    """Messages, names, metadata, payloads, results and errors reach the operator's terminal
    with control characters shown as escapes; --json stays exact."""
    sock = daemon.socket
    ok(ctl(sock, "msg", "send", "--from", "lead", "--to", "esc", HOSTILE,
           "--metadata", json.dumps({"k": HOSTILE})))
    with SyncClient(sock) as c:
        c.update_agent_status("esc", "busy", {"note": HOSTILE})
        job = c.enqueue(kind="k", required_role="cpu", priority=1,
                        payload={"p": HOSTILE}).job_id
    raw = ok_json(ctl(sock, "--json", "msg", "read", "--as", "esc", "--keep",
                      "--visibility", "0.1"))
    assert raw["messages"][0]["content"] == HOSTILE
    assert raw["messages"][0]["metadata"] == {"k": HOSTILE}
    time.sleep(0.2)
    shown = {
        "msg read": ok(ctl(sock, "msg", "read", "--as", "esc", "--keep")),
        "agents": ok(ctl(sock, "agents")),
        "show": ok(ctl(sock, "show", job)),
        "list": ok(ctl(sock, "list")),
    }
    for what, out in shown.items():
        assert not any(c in out for c in CONTROL), (what, out)
    assert "\\x1b[2J" in shown["msg read"] and "\\u202e" in shown["agents"]
    assert "\\u001b" in shown["show"] and "\\u202e" in shown["show"]


def test_msg_ack_after_read_keep_empty_names_and_agent_pages(daemon):
    sock = daemon.socket
    mid = ok(ctl(sock, "msg", "send", "--from", "lead", "--to", "k", "hi")).strip()
    kept = ok_json(ctl(sock, "--json", "msg", "read", "--as", "k", "--keep",
                       "--visibility", "0.2"))
    assert [m["message_id"] for m in kept["messages"]] == [mid] and kept["acked"] == 0
    assert ok(ctl(sock, "msg", "ack", "--as", "k", mid)) == "acked 1 message(s)\n"
    time.sleep(0.3)
    assert "no messages for k" in ok(ctl(sock, "msg", "read", "--as", "k"))
    for args in (("msg", "read", "--as", ""), ("msg", "send", "--from", "", "--to", "k", "x"),
                 ("msg", "ack", "--as", "", "x")):
        refused(ctl(sock, *args), 2, "usage")
    assert "reports a status" in ok(ctl(sock, "agents"))
    with SyncClient(sock) as c:
        for name in ("a1", "a2", "a3"):
            c.update_agent_status(name, "idle")
    page = ok_json(ctl(sock, "--json", "agents", "--limit", "2"))
    assert [a["name"] for a in page["agents"]] == ["a1", "a2"] and page["next_after"] == "a2"
    assert "more after --after a2" in ok(ctl(sock, "agents", "--limit", "2"))
    rest = ok_json(ctl(sock, "--json", "agents", "--after", "a2"))
    assert [a["name"] for a in rest["agents"]] == ["a3"] and rest["next_after"] is None
