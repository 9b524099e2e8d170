"""coordctl's enqueue against a real coordd process (the `daemon` fixture): the id it
prints, idempotency keys, delays, batches from JSON lines, payloads from a file, and what
it refuses before anything is sent (bad JSON, non-finite numbers, far times, a priority
out of range, flags coordd would not take) or names from coordd's reply (a batch's bad
line). The other commands are tests/integration/test_coordctl.py."""

from __future__ import annotations

import json
import time

from tests.integration.test_coordctl import JOB_ID, ctl, enqueue, ok, ok_json, refused


def test_enqueue_prints_id_that_show_returns(daemon):
    job_id = enqueue(daemon.socket, "--max-attempts", "5", priority=0,
                     payload='{"texts": ["hello [world]"]}')
    job = ok_json(ctl(daemon.socket, "show", job_id, "--json"))
    assert job["job_id"] == job_id and job["status"] == "waiting"
    assert job["payload"] == {"texts": ["hello [world]"]}
    assert (job["priority"], job["max_attempts"], job["kind"]) == (0, 5, "echo")
    assert [e["to_status"] for e in job["events"]] == ["waiting"]
    human = ok(ctl(daemon.socket, "show", job_id))
    assert job_id in human and "hello [world]" in human and "enqueued" in human
    assert "no live worker with role cpu" in human
    refused(ctl(daemon.socket, "show", "0000000000000000"), 1, "not_found")


def test_enqueue_with_same_key_gives_same_id(daemon):
    first = enqueue(daemon.socket, "--key", "req-42", "--delay", "60")
    again = ok_json(ctl(daemon.socket, "--json", "enqueue", "--kind", "echo", "--role", "cpu",
                        "--priority", "1", "--payload", '{"n": 1}', "--key", "req-42",
                        "--delay", "60"))
    assert again == {"job_id": first, "created": False}
    out = ok(ctl(daemon.socket, "enqueue", "--kind", "echo", "--role", "cpu", "--priority",
                 "1", "--payload", '{"n": 1}', "--key", "req-42", "--delay", "60"))
    assert out == f"{first} (already enqueued)\n"
    # the same key with another payload is refused, naming the key and the job
    line = refused(ctl(daemon.socket, "enqueue", "--kind", "echo", "--role", "cpu",
                       "--priority", "1", "--payload", '{"n": 2}', "--key", "req-42",
                       "--delay", "60"), 1, "invalid_state")
    assert "'req-42'" in line and first in line
    assert ok_json(ctl(daemon.socket, "--json", "status"))["jobs"]["waiting"] == 1


def test_non_finite_json_and_far_times_are_refused_before_anything_is_sent(daemon, tmp_path):
    sock = daemon.socket
    base = ("enqueue", "--kind", "k", "--role", "cpu", "--priority", "1")
    for payload in ('{"x": NaN}', '[Infinity]', '{"x": -Infinity}', '{"x": 1e999}'):
        line = refused(ctl(sock, *base, "--payload", payload), 2, "usage")
        assert "--payload" in line and "finite" in line, line
    line = refused(ctl(sock, *base, "--payload", "{}", "--gates",
                       '{"max_memory_pct": NaN}'), 2, "usage")
    assert "--gates" in line
    assert "--delay" in refused(ctl(sock, *base, "--payload", "{}", "--delay", "1e12"), 2,
                                "usage")
    assert "2100-01-01" in refused(ctl(sock, *base, "--payload", "{}", "--run-at", "1e15"),
                                   2, "usage")
    batch = tmp_path / "nan.jsonl"
    batch.write_text('{"payload": 1}\n{"payload": {"x": NaN}}\n')
    assert "line 2" in refused(ctl(sock, *base, "--batch", str(batch)), 2, "usage")
    line = refused(ctl(sock, "msg", "send", "--to", "b", "--content-json", '{"x": NaN}'), 2,
                   "usage")
    assert "CONTENT" in line
    assert ok_json(ctl(sock, "--json", "status"))["jobs"]["waiting"] == 0


def test_batch_errors_from_coordd_name_the_line_and_repeats_say_already_enqueued(
        daemon, tmp_path):
    sock = daemon.socket
    batch = tmp_path / "jobs.jsonl"
    batch.write_text('{"payload": 1, "idempotency_key": "a"}\n\n'
                     '{"payload": 2, "priority": 7}\n')
    line = refused(ctl(sock, "enqueue", "--batch", str(batch), "--kind", "k", "--role", "cpu",
                       "--priority", "1"), 1, "bad_request")
    assert f"--batch {batch} line 3: priority must be 0..3" in line, line
    batch.write_text('{"payload": 1, "idempotency_key": "a"}\n{"payload": 2}\n')
    args = ("enqueue", "--batch", str(batch), "--kind", "k", "--role", "cpu", "--priority", "1")
    ids = ok(ctl(sock, *args)).splitlines()
    again = ok(ctl(sock, *args)).splitlines()
    assert again[0] == f"{ids[0]} (already enqueued)" and again[1] != ids[1]
    batch.write_text('{"payload": 3}\n{"payload": 9, "idempotency_key": "a"}\n')
    line = refused(ctl(sock, *args), 1, "invalid_state")
    assert f"line 2: idempotency key 'a' is taken by job {ids[0]}" in line, line


def test_enqueue_delay_is_scheduled(daemon):
    job_id = enqueue(daemon.socket, "--delay", "600")
    job = ok_json(ctl(daemon.socket, "--json", "show", job_id))
    assert job["run_at"] > time.time() + 500
    assert job["waiting_reason"].startswith("scheduled until ")


def test_batch_enqueue_from_jsonl(daemon, tmp_path):
    lines = [json.dumps({"kind": "embed", "required_role": "cpu", "priority": 2,
                         "payload": {"i": i}}) for i in range(3)]
    batch = tmp_path / "jobs.jsonl"
    batch.write_text("\n".join(lines[:2]) + "\n\n" + lines[2] + "\n")
    ids = ok(ctl(daemon.socket, "enqueue", "--batch", str(batch))).splitlines()
    assert len(ids) == 3 and len(set(ids)) == 3 and all(JOB_ID.match(i) for i in ids)
    listed = ok_json(ctl(daemon.socket, "--json", "list", "--kind", "embed"))["jobs"]
    assert [j["job_id"] for j in listed] == ids
    assert [j["payload"] for j in listed] == [{"i": 0}, {"i": 1}, {"i": 2}]
    # flags fill fields a line omits; a line missing a required field is a usage error
    partial = tmp_path / "partial.jsonl"
    partial.write_text('{"payload": 1}\n{"payload": 2, "priority": 0}\n')
    res = ok_json(ctl(daemon.socket, "--json", "enqueue", "--batch", str(partial),
                      "--kind", "k2", "--role", "cpu", "--priority", "3"))
    prios = [ok_json(ctl(daemon.socket, "--json", "show", j["job_id"]))["priority"]
             for j in res["jobs"]]
    assert prios == [3, 0]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(lines[0] + "\n" + '{"kind": "x"}\n')
    line = refused(ctl(daemon.socket, "enqueue", "--batch", str(bad)), 2, "usage")
    assert "line 2" in line
    assert ok_json(ctl(daemon.socket, "--json", "status"))["jobs"]["waiting"] == 5


def test_payload_from_file(daemon, tmp_path):
    payload = {"prompt": "résumé", "n": [1, 2, 3]}
    (tmp_path / "p.json").write_text(json.dumps(payload))
    job_id = enqueue(daemon.socket, payload=f"@{tmp_path / 'p.json'}")
    assert ok_json(ctl(daemon.socket, "--json", "show", job_id))["payload"] == payload
    job_id2 = ok(ctl(daemon.socket, "enqueue", "--kind", "k", "--role", "cpu", "--priority", "1",
                     "--payload", "@-", stdin='{"from": "stdin"}')).strip()
    assert ok_json(ctl(daemon.socket, "--json", "show", job_id2))["payload"] == {"from": "stdin"}
    line = refused(ctl(daemon.socket, "enqueue", "--kind", "k", "--role", "cpu", "--priority",
                       "1", "--payload", f"@{tmp_path / 'missing.json'}"), 2, "usage")
    assert "missing.json" in line


def test_bad_json_payload_is_usage_error(daemon):
    line = refused(ctl(daemon.socket, "enqueue", "--kind", "k", "--role", "cpu", "--priority",
                       "1", "--payload", "{not json"), 2, "usage")
    assert "--payload is not valid JSON" in line
    refused(ctl(daemon.socket, "enqueue", "--kind", "k", "--payload", "{}"), 2, "usage")
    refused(ctl(daemon.socket, "enqueue", "--kind", "k", "--role", "cpu", "--priority", "1",
                "--payload", "{}", "--gates", "[1]"), 2, "usage")
    assert ok_json(ctl(daemon.socket, "--json", "status"))["jobs"]["waiting"] == 0


def test_priority_out_of_range_is_refused(daemon):
    p = ctl(daemon.socket, "enqueue", "--kind", "k", "--role", "cpu", "--priority", "7",
            "--payload", "{}")
    assert "0..3" in refused(p, 2, "usage")
    assert p.stdout == ""


def test_flags_take_what_coordd_takes_and_refuse_the_rest_as_usage(daemon):
    """`--delay 0` is coordd's `>= 0` (due now); a filter no job can match (`list
    --priority 9`, an empty kind) is a usage error, not an empty list."""
    sock = daemon.socket
    job = enqueue(sock, "--delay", "0")
    shown = ok_json(ctl(sock, "--json", "show", job))
    assert shown["status"] == "waiting" and shown["run_at"] <= time.time() + 1
    for args, flag in [(("list", "--priority", "9"), "--priority"),
                       (("list", "--priority", "-1"), "--priority"),
                       (("list", "--role", ""), "--role"),
                       (("enqueue", "--kind", "k", "--role", "cpu", "--priority", "1",
                         "--payload", "{}", "--max-attempts", "0"), "--max-attempts")]:
        assert flag in refused(ctl(sock, *args), 2, "usage")
