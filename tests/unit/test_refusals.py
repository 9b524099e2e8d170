"""A refused client backs off (coordd.transport.Refusals) and coordd logs a refused peer
once per episode (coordd.net.tls.RefusalLog): issue 31 item 5. Injected clock and rng."""

from __future__ import annotations

import logging
import random
import time

from coordd.clock import FakeClock
from coordd.net.tls import RefusalLog
from coordd.transport import Connector, Refusals
from tests.integration.fleet_certs import make_fleet


def test_refusal_backoff_doubles_to_the_cap_with_jitter():
    clock = FakeClock()
    r = Refusals(base_s=1.0, cap_s=30.0, rng=random.Random(7), clock=clock)
    assert r.admit() is None  # no episode: dial
    waits = []
    for n in range(1, 10):
        wait = r.refused("worker id wa is on the deny-list")
        step = min(30.0, 2.0 ** (n - 1))
        assert step / 2 <= wait <= step, (n, wait)
        waits.append(wait)
        why = r.admit()
        assert why is not None and "deny-list" in why and "next try in" in why
        clock.advance(wait - 0.01)
        assert r.admit() is not None  # not before the backoff ends
        clock.advance(0.02)
        assert r.admit() is None  # this dial goes out
    assert max(waits) <= 30.0 and waits[-1] >= 15.0  # reached the cap
    # ten minutes of refusals cost ~ log2(cap) + 600 / (cap * 3/4) dials, not 600
    r.answered()
    assert r.count == 0 and r.admit() is None


def test_while_one_dial_is_out_the_other_connections_wait():
    clock = FakeClock()
    r = Refusals(base_s=1.0, cap_s=60.0, rng=random.Random(1), clock=clock)
    for _ in range(4):
        clock.advance(r.refused("x"))
    assert r.admit() is None          # the heartbeat's connection dials
    assert r.admit() is not None      # the control watch's waits for its outcome
    clock.advance(r.refused("x"))     # refused again: both wait the next step
    assert r.count == 5


def test_refusal_log_once_per_episode_per_host_and_reason(caplog):
    clock = FakeClock()
    log = RefusalLog(clock=clock, quiet_s=900.0, max_keys=3)
    caplog.set_level(logging.WARNING, logger="coordd.net.tls")
    for _ in range(20):
        log.note("10.0.0.7", "certificate has expired", "refused a TLS handshake", "tls_refused")
        clock.advance(60)  # a worker at its backoff cap
    assert len(caplog.records) == 1 and log.repeats == 19
    line = caplog.records[0].getMessage()
    assert "10.0.0.7" in line and "certificate has expired" in line and "15 min" in line
    log.note("10.0.0.8", "certificate has expired", "refused a TLS handshake", "tls_refused")
    log.note("10.0.0.7", "worker id wa is on the deny-list", "refused a TCP peer", "peer_refused")
    assert len(caplog.records) == 3  # another host, another reason: episodes of their own
    clock.advance(900)  # quiet for quiet_s: the episode is over
    log.note("10.0.0.7", "certificate has expired", "refused a TLS handshake", "tls_refused")
    assert len(caplog.records) == 4


def test_refusal_log_forgets_the_oldest_episode_past_its_bound():
    clock = FakeClock()
    log = RefusalLog(clock=clock, quiet_s=900.0, max_keys=2)
    assert log.first("a", "r") and log.first("b", "r") and log.first("c", "r")
    assert not log.first("c", "r") and not log.first("b", "r")
    assert log.first("a", "r")  # forgotten (the bound), so logged again: memory stays bounded


def test_only_a_quick_close_of_a_tls_connection_reads_as_a_refused_certificate(tmp_path):
    """A reset (or EOF, or a TLS alert) within connect_timeout_s of the connect, nothing
    answered: coordd refused the certificate, and the worker names what it can see. A
    timeout (a partition) or a late close is an outage, not a refusal."""
    fleet = make_fleet(tmp_path, time.time())
    clock = FakeClock(start=time.time())
    c = Connector(f"tls://127.0.0.1:{fleet.port}", fleet.files("worker-wa", fleet.rogue_dir),
                  clock=clock, connect_timeout_s=5.0)
    c.opened_at = clock.mono()
    why = c.closed_unanswered(ConnectionResetError())
    assert why is not None and "issued by CN=rogue CA, not by the fleet CA" in why
    assert c.closed_unanswered(None) is not None  # EOF
    assert c.closed_unanswered(TimeoutError()) is None
    clock.advance(6.0)
    assert c.closed_unanswered(ConnectionResetError()) is None
    good = Connector(f"tls://127.0.0.1:{fleet.port}", fleet.files("worker-wa"), clock=clock)
    good.opened_at = clock.mono()
    assert "coordd's log says why" in good.closed_unanswered(ConnectionResetError())
    assert Connector("/run/x.sock").closed_unanswered(None) is None  # not TLS
