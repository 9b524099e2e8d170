"""The TCP deny-lists are checked by coordd.config like every other setting, at start and
on SIGHUP's reload alike (coordd.daemon.reload loads the file with coordd.config.load)."""

from __future__ import annotations

import pytest

from coordd import config
from coordd.daemon import reload
from coordd.errors import ConfigError
from coordd.net.tls import DenyList, TlsPeer


@pytest.mark.parametrize("text,why", [
    ('tls_deny_workers = "wb"', "Expected `array`, got `str` - at `$.tls_deny_workers`"),
    ('tls_deny_workers = ["wa", 3]', "at `$.tls_deny_workers[1]`"),
    ('tls_deny_workers = [""]', "tls_deny_workers: '': a worker id must be 1.."),
    ('tls_deny_workers = ["w\\u202ea"]', "control or bidi-override"),
    ('tls_deny_serials = "1f"', "at `$.tls_deny_serials`"),
    ('tls_deny_serials = ["zz"]', "tls_deny_serials: 'zz' is not a certificate serial"),
    ('tls_deny_serials = ["0x1f"]', "not a certificate serial"),
    ('tls_deny_serials = [""]', "not a certificate serial"),
    ('tls_deny_serials = ["1f::3a"]', "not a certificate serial"),
    ('tls_deny_serials = [":1f"]', "not a certificate serial"),
    ('tls_deny_serials = ["' + "1" * 41 + '"]', "longer than a certificate serial"),
])
def test_bad_deny_lists_are_config_errors(tmp_path, text, why):
    path = tmp_path / "c.toml"
    path.write_text(text + "\n")
    with pytest.raises(ConfigError) as got:
        config.load(str(path))
    assert why in str(got.value) and str(path) in str(got.value)


def test_good_deny_lists_load_and_match_any_spelling(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('tls_deny_workers = ["wb"]\n'
                    'tls_deny_serials = ["00:1F:3A", "' + "0" * 2 + "a" * 40 + '"]\n')
    cfg = config.load(str(path))
    deny = DenyList.of(cfg.tls_deny_workers, cfg.tls_deny_serials)
    assert deny.why(TlsPeer("a", "wb", None, "99")) is not None
    assert deny.why(TlsPeer("a", "wa", None, "1f3a")) is not None
    assert deny.why(TlsPeer("a", "wa", None, "a" * 40)) is not None
    assert deny.why(TlsPeer("a", "wa", None, "1f3b")) is None


class _Listener:
    def __init__(self) -> None:
        self.got: list[object] = []

    def reload(self, fresh: object) -> None:
        self.got.append(fresh)


def test_reload_hands_listeners_the_loaded_config_or_none(tmp_path, caplog):
    path = tmp_path / "c.toml"
    path.write_text('tls_deny_workers = ["wb"]\n')
    running = config.load(None)
    tcp = _Listener()
    assert "reloaded the TLS certificates and deny-lists" in reload.reload(
        running, str(path), [tcp, None])
    assert tcp.got[0].tls_deny_workers == ["wb"]
    path.write_text('tls_deny_workers = "wb"\n')
    caplog.clear()
    line = reload.reload(running, str(path), [tcp])
    assert tcp.got[1] is None and "tls_deny_workers" in line
    errors = [r for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and "deny-lists and every other setting are unchanged" \
        in errors[0].getMessage()
