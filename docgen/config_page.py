"""docs/reference/configuration.md: coordd's and the worker's TOML keys, from their
config Structs (type, default, unit, range, meaning), the checks beyond each key's range,
the command lines of coordd, coord-worker and the other programs, and the environment
variables they read."""

from __future__ import annotations

import argparse
import os
from typing import Any
from unittest import mock

import msgspec

from coordd import config as coordd_config
from coordd import config_defaults
from coordd.rules import gates
from coordd.rules import limits
from coordd.rules import ranges
from coordd.rules import resources
from coordd.__main__ import build_parser as coordd_parser
from coordd.wire.protocol import Readings
from docgen import md
from docgen.cli_page import fixed_width, options_table
from worker import config as worker_config
from worker import probes
from worker.__main__ import build_parser as worker_parser

UNITS = (("_s", "seconds"), ("_ms", "milliseconds"), ("_bytes", "bytes"), ("_pct", "percent"),
         ("_c", "°C"), ("_mb", "MiB"), ("_pages", "pages"), ("_chars", "characters"))


def unit(name: str) -> str:
    """The unit a key's name says (its suffix), or empty."""
    for suffix, word in UNITS:
        if name.endswith(suffix):
            return word
    return ""


def range_text(name: str, rule: ranges.Range | None) -> str:
    """`unit, range` of a key (a duration's 10-year cap is said once, in the intro)."""
    text = ""
    if rule is not None:
        if rule.high == ranges.SECONDS_MAX:
            rule = ranges.Range(rule.low, None, rule.low_open)
        text = rule.text()
    return ", ".join(x for x in (unit(name), text) if x)


def key_rows(cls: type[msgspec.Struct], rules: dict[str, ranges.Range]) -> list[list[str]]:
    """One row per field: key, type, default, unit and range, meaning."""
    notes = md.field_notes(cls)
    rows = []
    for f in msgspec.structs.fields(cls):
        rows.append([md.code(f.name), md.type_text(f.type), md.code(md.default_text(f)),
                     range_text(f.name, rules.get(f.name)), notes.get(f.name, "")])
    return rows


HEAD = ["key", "type", "default", "unit, range", "meaning"]


def checks(*funcs: Any) -> str:
    """The ValueError messages of `funcs` as a bullet list."""
    msgs = [m for f in funcs for m in md.raised_messages(f)]
    return "".join(f"- {m}\n" for m in msgs)


def gates_section() -> str:
    """The `[gates.pN]` keys, with each priority's built-in default."""
    policies = gates.default_policies()
    notes = md.field_notes(gates.GatePolicy)
    rows = []
    for f in msgspec.structs.fields(gates.GatePolicy):
        rows.append([md.code(f.name), md.type_text(f.type)]
                    + [md.code(md.value_text(getattr(policies[p], f.name))) for p in range(4)]
                    + [range_text(f.name, config_defaults.GATE_RANGES.get(f.name)),
                       notes.get(f.name, "")])
    return (
        "### `[gates.p0]` .. `[gates.p3]`: gate policies\n\n"
        f"{md.summary(gates.GatePolicy.__doc__)} Keys given in a table replace that "
        "priority's built-in default; a job's own `gates` (enqueue) override them again.\n\n"
        f"{md.summary(gates.default_policies.__doc__)}\n\n"
        + md.table(["key", "type", "P0", "P1", "P2", "P3", "unit, range", "meaning"], rows)
        + "\nChecked when the file is loaded:\n\n" + checks(gates.GatePolicy.__post_init__)
        + "\n")


def limits_section() -> str:
    """The `[limits.NAME]` keys."""
    return (
        "### `[limits.NAME]`: fleet-wide limits\n\n"
        f"{md.summary(limits.LimitSpec.__doc__)} `coordctl limits set` overrides them at "
        "runtime. `rate` and each `budget` value are `N/WINDOW` with a window of "
        f"{', '.join(md.code(w) for w in limits.WINDOWS_S)} (e.g. `120/min`, `5/10s`).\n\n"
        + md.table(HEAD, key_rows(limits.LimitSpec, {})) + "\n")


def worker_sections() -> str:
    """coord-worker's keys, kinds, resources, reading keys and command line."""
    res_rules = {k: ranges.Range(0, v) for k, v in resources.MAX.items()}
    placeholders = ", ".join(f"`{{{p}}}` (`COORD_{p.upper()}`)"
                             for p in worker_config.PLACEHOLDERS)
    return (
        "## coord-worker\n\n"
        "`coord-worker --config FILE` reads one TOML file. "
        f"{later_paragraphs(worker_config.__doc__)}"
        "\n\n### Top-level keys\n\n"
        + md.table(HEAD, key_rows(worker_config.WorkerConfig, worker_config.RANGES))
        + "\nChecked when the file is loaded, beyond each key's range:\n\n"
        + checks(worker_config.WorkerConfig.__post_init__) + "\n"
        "### `[kinds.NAME]`: job kinds\n\n"
        f"{md.summary(worker_config.KindConfig.__doc__)} In `argv`, the placeholders "
        f"{placeholders} and `{{python}}` (the worker's own interpreter) are replaced; the "
        "model gets the same values in its environment.\n\n"
        + md.table(HEAD, key_rows(worker_config.KindConfig, worker_config.KIND_RANGES))
        + "\nChecked when the file is loaded:\n\n" + checks(worker_config.KindConfig.check)
        + "\n#### A kind's `resources`\n\n"
        f"{md.summary(resources.Request.__doc__)}\n\n"
        + md.table(HEAD, key_rows(resources.Request, res_rules)) + "\n"
        "### `[resources]`: what this worker offers\n\n"
        f"{md.summary(worker_config.ResourcesConfig.__doc__)}\n\n"
        + md.table(HEAD, key_rows(worker_config.ResourcesConfig,
                                  worker_config.RESOURCE_RANGES)) + "\n"
        + readings_section()
        + "### Command line\n\n" + command_line(worker_parser()))


def readings_section() -> str:
    """The keys a `--readings-override` file may hold."""
    hints = {f.name: f.type for f in msgspec.structs.fields(Readings)}
    notes = md.field_notes(Readings)
    rows = [[md.code(k), md.type_text(hints.get(k, str | None)), unit(k), notes.get(k, "")]
            for k in probes.READING_KEYS]
    return ("### `--readings-override FILE`: reading keys\n\n"
            "A JSON object whose keys replace the probes' readings, read again on every "
            "heartbeat (for drills and tests of the gates). The keys a probe or a gate "
            "reads (others are warned about once):\n\n"
            + md.table(["key", "type", "unit", "meaning"], rows) + "\n")


def later_paragraphs(doc: str | None) -> str:
    """A module docstring without its first paragraph (which says what the module is)."""
    return " ".join(md.summary(doc).split("\n\n")[1:])


def command_line(parser: argparse.ArgumentParser) -> str:
    """The usage line and the options table of a daemon's parser."""
    with fixed_width():
        usage = parser.format_usage().removeprefix("usage: ").rstrip()
    return (f"```text\n{usage}\n```\n\n{md.summary(parser.description)}\n\n"
            + options_table(parser) + "\n")


class _Captured(Exception):
    def __init__(self, parser: argparse.ArgumentParser) -> None:
        super().__init__(parser.prog)
        self.parser = parser


def captured_parser(entry: Any, argv: list[str]) -> argparse.ArgumentParser:
    """The parser a program's entry point builds: `entry(argv)` runs until its first
    `parse_args`, which hands the parser back instead of parsing. Run with HOME=~ and no
    STATE_DIRECTORY, so a default under the home folder reads `~/...` on every machine."""
    def grab(self: argparse.ArgumentParser, *args: Any, **kw: Any) -> Any:
        raise _Captured(self)

    env = {"HOME": "~", "STATE_DIRECTORY": None}
    old = {k: os.environ.get(k) for k in env}
    try:
        for k, v in env.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
        with mock.patch.object(argparse.ArgumentParser, "parse_args", grab):
            entry(argv)
    except _Captured as got:
        return got.parser
    finally:
        for k, v in old.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
    raise RuntimeError(f"{entry} built no argument parser")


def other_programs() -> str:
    """coord-worker enroll, coordd-web and coordd-mcp: their command lines."""
    from coordd_mcp.__main__ import main as mcp_main
    from coordd_web.__main__ import parse as web_parse
    from worker.enroll import main as enroll_main
    out = ["## Other programs\n\n"]
    for title, entry in (("coord-worker enroll", enroll_main), ("coordd-web", web_parse),
                         ("coordd-mcp", mcp_main)):
        out.append(f"### {title}\n\n" + command_line(captured_parser(entry, [])))
    return "".join(out)


ENV_FOLDERS = ["coordd", "worker", "coordctl", "coordd_web", "coordd_mcp"]


def environment_section() -> str:
    """Every environment variable the programs read, where, and what that code says."""
    rows = [[md.code(name), md.code(where), text]
            for name, where, text in md.environment_reads(ENV_FOLDERS)]
    return ("## Environment variables\n\n"
            "Read by coordd, coord-worker, coordctl, coordd-web or coordd-mcp (found in the "
            "source; the model programs get theirs from `[kinds.NAME]` above). systemd sets "
            "`LISTEN_*`, `NOTIFY_SOCKET`, `WATCHDOG_*` and `STATE_DIRECTORY` for the units.\n\n"
            + md.table(["variable", "read in", "what the code says"], rows))


def render() -> str:
    """The whole page."""
    cfg = coordd_config.Config
    return (
        md.header("Configuration", "coordd/config.py, coordd/config_defaults.py, "
                  "coordd/rules/gates.py, coordd/rules/limits.py, worker/config.py and both "
                  "daemons' argparse parsers",
                  "Every key of coordd's and coord-worker's TOML files: its type, default, "
                  "unit, the range the code checks, and what it does. Unknown keys are an "
                  "error in both files (a typo never falls back to a default silently). "
                  "A command-line flag wins over the file. Durations are in seconds and "
                  f"at most {ranges.SECONDS_MAX:.0f} s (10 years); sizes are in bytes.")
        + "## coordd\n\n"
        "`coordd --config FILE` reads one TOML file. "
        f"{later_paragraphs(coordd_config.__doc__)} "
        "A SIGHUP re-reads the file and applies what can change at runtime.\n\n"
        "### Top-level keys\n\n"
        + md.table(HEAD, key_rows(cfg, config_defaults.RANGES))
        + "\nChecked when the file is loaded, beyond each key's range:\n\n"
        + checks(cfg.__post_init__, cfg._check_tcp) + "\n"
        + gates_section() + limits_section()
        + "### Command line\n\n" + command_line(coordd_parser())
        + worker_sections() + "\n" + other_programs() + environment_section())
