"""Several coordd addresses (coordd.failover, issue 20): a client connects to whichever
answers, starting at the last good one, and the worker's config and flags name them."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest

from coordd.client import Client
from coordd.config import load as load_coordd_config
from coordd.errors import ConfigError
from coordd.failover import Failover
from coordd.transport import ConnectFailed
from worker.__main__ import client_factory, parse_args
from worker.config import from_dict


async def _serve(path: Path) -> tuple[asyncio.AbstractServer, list[int]]:
    """A Unix server that counts its connections and answers nothing."""
    seen: list[int] = []

    async def conn(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(1)
        await reader.read()
        writer.close()
    return await asyncio.start_unix_server(conn, str(path)), seen


async def test_failover_connects_to_the_first_address_that_answers(tmp_path: Path,
                                                                   caplog) -> None:
    a, b = tmp_path / "a.sock", tmp_path / "b.sock"
    fo = Failover([str(a), str(b)], rng=random.Random(1))
    with pytest.raises(ConnectFailed) as none:  # nothing listens: both reasons named
        await fo.open()
    assert str(a) in none.value.message and str(b) in none.value.message
    server_b, seen_b = await _serve(b)
    _, w = await fo.open()  # a is still missing: b answers
    assert fo.endpoint == str(b) and fo.scheme == "unix" and fo.failures == 0
    w.close()
    server_a, seen_a = await _serve(a)
    _, w = await fo.open()  # the last good one first, though a answers now
    w.close()
    await asyncio.sleep(0.05)
    assert len(seen_b) == 2 and seen_a == []
    server_b.close()
    await server_b.wait_closed()
    b.unlink()
    caplog.clear()
    _, w = await fo.open()  # b gone: a, in turn
    w.close()
    assert fo.endpoint == str(a)
    moved = [r.getMessage() for r in caplog.records if r.name == "coordd.failover"]
    assert len(moved) == 1 and moved[0].startswith(f"coordd at {b}: ") \
        and moved[0].endswith(f"; connected to {a}"), moved  # the operator's fail-over line
    server_a.close()
    await server_a.wait_closed()


async def test_failover_backs_off_only_when_no_address_answers(tmp_path: Path) -> None:
    fo = Failover([str(tmp_path / "a.sock"), str(tmp_path / "b.sock")],
                  backoff_base_s=0.2, backoff_cap_s=0.2, rng=random.Random(3))
    for _ in range(3):
        with pytest.raises(ConnectFailed):
            await fo.open()
    assert fo.failures == 3
    with pytest.raises(ValueError):
        Failover([])


def test_worker_takes_several_sockets_from_flags_or_config(tmp_path: Path) -> None:
    a, b = str(tmp_path / "a.sock"), str(tmp_path / "b.sock")
    cfg = from_dict({"work_dir": str(tmp_path)})
    one = client_factory(parse_args(["--worker-id", "w", "--roles", "cpu", "--socket", a]), cfg)()
    assert one.path == a and one.connector is None  # one address: as before
    two = client_factory(parse_args(["--worker-id", "w", "--roles", "cpu", "--socket", a,
                                     "--socket", b]), cfg)()
    assert isinstance(two.connector, Failover)
    assert [c.endpoint for c in two.connector.connectors] == [a, b]
    listed = from_dict({"work_dir": str(tmp_path), "socket": [a, b]})
    three = client_factory(parse_args(["--worker-id", "w", "--roles", "cpu"]), listed)()
    assert [c.endpoint for c in three.connector.connectors] == [a, b]
    assert isinstance(three, Client)


def test_coordd_store_setting_takes_only_postgresql_dsns() -> None:
    assert load_coordd_config(None, store="postgresql://u@/db?host=/run/pg").store
    assert load_coordd_config(None).store == ""
    with pytest.raises(ConfigError, match="postgresql://"):
        load_coordd_config(None, store="mysql://db")


def test_a_bad_store_flag_is_named_as_the_flag_not_the_config(tmp_path) -> None:
    """`coordd --store mysql://...` says `--store:`; a bad `store` in the file names the
    file; with no file and no flag, the defaults."""
    with pytest.raises(ConfigError) as got:
        load_coordd_config(None, store="mysql://db")
    assert str(got.value).startswith("--store: store must be a postgresql:// DSN")
    cfg = tmp_path / "c.toml"
    cfg.write_text('store = "mysql://db"\n')
    with pytest.raises(ConfigError) as got:
        load_coordd_config(cfg)
    assert str(got.value).startswith(f"config {cfg}: store must be")
    cfg.write_text('reaper_interval_s = 1\n')
    with pytest.raises(ConfigError) as got:  # overrides are flags' values in coordd's main
        load_coordd_config(cfg, store_session_timeout_s=-1.0)
    assert str(got.value).startswith("--store-session-timeout-s: "), str(got.value)


def test_coordctl_top_refused_by_a_coordd_names_what_it_needs() -> None:
    """A coordd that does not serve one of top's reads (an older one, a store without
    `workers`): top says so as top, not as if the user had asked for that method."""
    import argparse

    from coordctl.commands import top
    from coordd.errors import UnknownMethod

    class Refuses:
        def status(self):
            raise UnknownMethod("workers: not available on the PostgreSQL store yet")
    with pytest.raises(UnknownMethod) as got:
        top(Refuses(), argparse.Namespace(json=True, interval=1.0, once=True))
    assert got.value.message.startswith("top: not available from this coordd: it needs "
                                        "the worker list (workers: not available")
