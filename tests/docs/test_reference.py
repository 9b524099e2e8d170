"""The generated reference pages (docgen) are up to date, and cover what the code has:
every config key, coordctl command and flag, RPC method, error code and metric."""

from __future__ import annotations

import argparse
import re

import msgspec
import pytest

from coordctl.__main__ import build_parser
from coordd import config as coordd_config
from coordd import config_defaults
from coordd.rules import gates
from coordd.rules import limits
from coordd.rules import ranges
from coordd.wire import protocol
from docgen import cli_page, config_page, md, protocol_page
from docgen.pages import PAGES, REGENERATE, ROOT, render_all
from worker import config as worker_config

RENDERED = render_all()


def page(rel: str) -> str:
    return (ROOT / rel).read_text()


@pytest.mark.parametrize("rel", sorted(PAGES))
def test_generated_page_is_up_to_date(rel):
    path = ROOT / rel
    assert path.exists(), f"{rel} is missing: run `{REGENERATE}` from the repository root"
    assert path.read_text() == RENDERED[rel], (
        f"{rel} is stale (the code changed since it was generated): run `{REGENERATE}` "
        "from the repository root and commit the result")


def test_rendering_is_deterministic():
    """Two renders are equal (no clock, path or dict-order leaks), so staleness is real."""
    assert render_all() == RENDERED


# ---------------------------------------------------------------- coverage


def section(text: str, heading: str) -> str:
    """The text from the heading line `heading` to the next heading of its level or above."""
    m = re.search(rf"^(#+) {re.escape(heading)}\s*$", text, re.M)
    assert m, f"no heading {heading!r}"
    level = len(m.group(1))
    end = re.compile(rf"^#{{1,{level}}} ", re.M).search(text, m.end())
    return text[m.end():end.start() if end else len(text)]


def row(name: str) -> str:
    """How a table row naming `name` starts (`| `name` |`, pipes escaped)."""
    return f"| {md.cell(md.code(name))} |"


def missing_rows(text: str, names: list[str]) -> list[str]:
    """The names without a table row of their own in `text`."""
    return [n for n in names if row(n) not in text]


def keys(cls: type[msgspec.Struct]) -> list[str]:
    return [f.encode_name for f in msgspec.structs.fields(cls)]


CONFIG_SECTIONS = [
    ("coordd", "Top-level keys", coordd_config.Config),
    ("coordd", "`[gates.p0]` .. `[gates.p3]`: gate policies", gates.GatePolicy),
    ("coordd", "`[limits.NAME]`: fleet-wide limits", limits.LimitSpec),
    ("coord-worker", "Top-level keys", worker_config.WorkerConfig),
    ("coord-worker", "`[kinds.NAME]`: job kinds", worker_config.KindConfig),
    ("coord-worker", "`[resources]`: what this worker offers", worker_config.ResourcesConfig),
]


@pytest.mark.parametrize("daemon,heading,cls", CONFIG_SECTIONS,
                         ids=[f"{d}-{c.__name__}" for d, _, c in CONFIG_SECTIONS])
def test_every_config_key_has_a_row(daemon, heading, cls):
    text = section(section(page("docs/reference/configuration.md"), daemon), heading)
    assert missing_rows(text, keys(cls)) == []


@pytest.mark.parametrize("daemon,heading,cls", CONFIG_SECTIONS,
                         ids=[f"{d}-{c.__name__}" for d, _, c in CONFIG_SECTIONS])
def test_each_config_key_has_a_meaning_of_its_own(daemon, heading, cls):
    """No key is left without a meaning, and no two keys share one (an `Attributes:`
    entry naming several keys gives them all its text: each key gets its own entry)."""
    notes = md.field_notes(cls)
    names = keys(cls)
    assert [n for n in names if not notes.get(n)] == []
    shared = {}
    for n in names:
        shared.setdefault(notes[n], []).append(n)
    assert [group for group in shared.values() if len(group) > 1] == []


def test_every_config_range_is_shown():
    """A key the code checks a range for shows that range in its row."""
    text = page("docs/reference/configuration.md")
    for name, rule in {**config_defaults.RANGES, **worker_config.RANGES}.items():
        shown = md.cell(config_page.range_text(name, rule))
        assert re.search(rf"^\| `{name}` \|.*\| {re.escape(shown)} \|", text, re.M), name


def test_every_environment_variable_is_documented():
    text = section(page("docs/reference/configuration.md"), "Environment variables")
    names = sorted({n for n, _w, _t in md.environment_reads(config_page.ENV_FOLDERS)})
    assert "COORDD_SOCKET" in names
    assert missing_rows(text, names) == []


def commands(parser: argparse.ArgumentParser, path: list[str]):
    """(command path, its parser) for every command and subcommand."""
    for name, _help, sp in cli_page.subcommands(parser):
        yield path + [name], sp
        yield from commands(sp, path + [name])


def test_every_coordctl_command_and_flag_is_documented():
    text = page("docs/reference/coordctl.md")
    parser = build_parser()
    glob = {a.dest for a in cli_page.options(parser)}
    missing = []
    for opt in cli_page.options(parser):
        if row(cli_page.flag_name(opt)) not in section(text, "Global options"):
            missing.append(cli_page.flag_name(opt))
    for path, sp in list(commands(parser, ["coordctl"])):
        title = f"`{' '.join(path)}`"
        if f"# {title}\n" not in text:
            missing.append(title)
            continue
        own = section(text, title)
        for opt in cli_page.options(sp, glob):
            if row(cli_page.flag_name(opt)) not in own:
                missing.append(f"{title} {cli_page.flag_name(opt)}")
    assert missing == []


def test_a_suppressed_argument_has_no_row():
    """An argument `--help` does not show (help=SUPPRESS: `limits`' trailing words) is
    not in the reference either; an optional positional (`?`, `*`) is not required."""
    text = RENDERED["docs/reference/coordctl.md"]
    assert "SUPPRESS" not in text
    own = section(text, "`coordctl limits`")
    assert row("ARG") not in own
    [words] = [line for line in own.splitlines() if line.startswith("| `NAME")]
    assert "| yes |" not in words, words


def test_every_dispatched_rpc_method_is_documented():
    """Every method in the protocol's PARAMS is served (has a handler) and has its
    section in protocol.md, with its params and result named."""
    text = page("docs/reference/protocol.md")
    handlers = protocol_page.handlers()
    assert sorted(handlers) == sorted(protocol.PARAMS)
    for method, params in protocol.PARAMS.items():
        own = section(text, f"`{method}`")
        assert f"**Params** ([{params.__name__}]" in own, method
        result = protocol_page.result_type(handlers[method])
        assert result is not None, f"{method}: its handler has no return annotation"
        assert "**Result**:" in own, method
        for field in keys(params):
            assert f"| `{field}` |" in own, f"{method}: {field}"


def test_every_error_code_is_documented():
    text = section(page("docs/reference/protocol.md"), "Error codes")
    assert missing_rows(text, list(protocol.ERROR_CODES)) == []


def test_every_metric_family_is_documented():
    """Every family a scrape of coordd's registry yields has its row."""
    from coordd.ops.metrics import Metrics
    text = page("docs/reference/metrics.md")
    scraped = [mf.name for mf in Metrics().registry.collect()]
    assert scraped
    assert missing_rows(text, scraped) == []


def test_a_missing_entry_is_caught():
    """The coverage checks fail for a key, flag or method the page lacks."""
    text = page("docs/reference/configuration.md")
    assert missing_rows(text, ["lease_default_s", "no_such_key_x"]) == ["no_such_key_x"]
    with pytest.raises(AssertionError, match="no heading"):
        section(page("docs/reference/protocol.md"), "`no_such_method`")


# ---------------------------------------------------------------- a change in the code


def test_a_new_config_key_makes_the_page_stale(monkeypatch):
    """A key added to coordd's Config without regenerating: the committed page no longer
    matches, and the new render has the key's row (type, default, unit, range)."""
    class Config(coordd_config.Config, kw_only=True, forbid_unknown_fields=True):
        new_knob_s: float = 2.5

    monkeypatch.setattr(config_defaults, "RANGES", {**config_defaults.RANGES,
                                                    "new_knob_s": ranges.POSITIVE_S})
    monkeypatch.setattr(coordd_config, "Config", Config)
    text = config_page.render()
    assert text != page("docs/reference/configuration.md")
    assert re.search(r"^\| `new_knob_s` \| float \| `2.5` \| seconds, > 0 \|", text, re.M)


def test_a_new_coordctl_flag_makes_the_page_stale(monkeypatch):
    def parser():
        p = build_parser()
        [status] = [sp for n, _h, sp in cli_page.subcommands(p) if n == "status"]
        status.add_argument("--brand-new", metavar="N", help="a new flag")
        return p

    monkeypatch.setattr(cli_page, "build_parser", parser)
    text = cli_page.render()
    assert text != page("docs/reference/coordctl.md")
    assert "| `--brand-new` | `N` |" in section(text, "`coordctl status`")


def test_a_new_rpc_method_without_a_handler_is_caught(monkeypatch):
    """A params Struct registered for a method nobody serves is not silently left out."""
    class Frobnicate(msgspec.Struct, kw_only=True):
        """`frobnicate`: nothing."""

    monkeypatch.setitem(protocol.PARAMS, "frobnicate", Frobnicate)
    assert "frobnicate" not in protocol_page.handlers()
    assert sorted(protocol_page.handlers()) != sorted(protocol.PARAMS)
