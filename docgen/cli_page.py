"""docs/reference/coordctl.md: every coordctl command, flag, default and help, walked
from its argparse parser (coordctl.__main__.build_parser)."""

from __future__ import annotations

import argparse
import contextlib
import os
from collections.abc import Iterator

from coordctl.__main__ import build_parser
from coordd.rules import ranges
from docgen import md

USAGE_COLUMNS = "80"  # argparse wraps usage lines at $COLUMNS: fixed, so the page is stable

EXAMPLE = """\
## Example

A first job, end to end: enqueue it, wait for it, show it, list what ran. Run against a
coordd and a worker that runs the `keywords` kind for the role `cpu` (this block is run
by the documentation tests).

<!-- runnable -->
```bash
job=$(coordctl enqueue --kind keywords --role cpu --priority 1 \\
        --payload '{"module": "json", "top": 3}')
coordctl enqueue --kind keywords --role cpu --priority 1 \\
        --payload '{"module": "json", "top": 3}' --wait
coordctl show "$job"
coordctl list --kind keywords
coordctl --json status
```
"""


@contextlib.contextmanager
def fixed_width() -> Iterator[None]:
    """Make argparse wrap at USAGE_COLUMNS whatever the terminal is."""
    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = USAGE_COLUMNS
    try:
        yield
    finally:
        if old is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = old


def type_words(action: argparse.Action) -> str:
    """The value a flag takes: its type's name and the range it checks (coordctl's
    `_number` types carry a coordd.rules.ranges.Range)."""
    kind = action.type
    if kind is None:
        return ""
    name = getattr(kind, "__name__", "")
    for c in getattr(kind, "__closure__", None) or ():
        try:
            value = c.cell_contents
        except ValueError:
            continue
        if isinstance(value, ranges.Range):
            return f"{name}, {value.text()}"
    return {"_name": "name", "_positive": "number > 0"}.get(name, name)


def flag_name(action: argparse.Action) -> str:
    """`--kind`, `-o/--out`, or a positional's metavar."""
    if action.option_strings:
        return ", ".join(action.option_strings)
    return str(action.metavar or action.dest)


def value_text(action: argparse.Action) -> str:
    """What follows the flag: its metavar, choices, or nothing for a switch."""
    if action.nargs == 0:
        return ""
    if action.choices and not isinstance(action, argparse._SubParsersAction):
        return " | ".join(md.code(c) for c in action.choices)
    extra = type_words(action)
    if not action.option_strings:  # a positional: its name is in the first column
        return extra
    metavar = action.metavar or action.dest.upper()
    return md.code(metavar) + (f" ({extra})" if extra else "")


def default_text(action: argparse.Action) -> str:
    """The default as TOML/JSON writes it; empty for none, a switch or an empty list."""
    if action.default in (None, False, argparse.SUPPRESS, []) or action.nargs == 0:
        return ""
    return md.code(md.value_text(action.default))


def options(parser: argparse.ArgumentParser, skip: set[str] = frozenset()
            ) -> list[argparse.Action]:
    """The parser's own arguments, less help, subcommands, those `--help` does not show
    (help=SUPPRESS) and those whose dest is in `skip`."""
    return [a for a in parser._actions
            if not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction))
            and a.help != argparse.SUPPRESS and a.dest not in skip]


def help_text(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    """The help as `--help` prints it (`%(default)s` and the like filled in)."""
    text = action.help or ""
    if "%" not in text:
        return text
    params = {**vars(action), "prog": parser.prog}
    params["default"] = md.value_text(action.default).strip('"')
    try:
        return text % params
    except (KeyError, TypeError, ValueError):
        return text


def options_table(parser: argparse.ArgumentParser, skip: set[str] = frozenset()) -> str:
    """A table of the parser's arguments: flag, value, default, required, help."""
    rows = []
    for a in options(parser, skip):
        needed = a.required if a.option_strings else a.nargs not in ("?", "*")
        required = "yes" if needed \
            else "one of" if any(g.required and a in g._group_actions
                                 for g in parser._mutually_exclusive_groups) else ""
        rows.append([md.code(flag_name(a)), value_text(a), default_text(a), required,
                     help_text(parser, a)])
    if not rows:
        return "No options.\n"
    notes = ""
    for group in parser._mutually_exclusive_groups:
        names = ", ".join(md.code(flag_name(a)) for a in group._group_actions)
        notes += (f"\nExactly one of {names} is required.\n" if group.required
                  else f"\nAt most one of {names}.\n")
    return md.table(["argument", "value", "default", "required", "help"], rows) + notes


def subcommands(parser: argparse.ArgumentParser
                ) -> list[tuple[str, str, argparse.ArgumentParser]]:
    """(name, help, parser) of each subcommand, in the order they were added."""
    out = []
    for a in parser._actions:
        if isinstance(a, argparse._SubParsersAction):
            helps = {c.dest: c.help or "" for c in a._choices_actions}
            out += [(name, helps.get(name, ""), sp) for name, sp in a.choices.items()]
    return out


def command(path: list[str], help_: str, parser: argparse.ArgumentParser, globals_: set[str],
            level: int) -> str:
    """The section of one command, then its subcommands'."""
    usage = parser.format_usage().removeprefix("usage: ").rstrip()
    out = [f"{'#' * level} `{' '.join(path)}`\n", f"{help_}\n" if help_ else "",
           f"```text\n{usage}\n```\n", options_table(parser, globals_)]
    if parser.epilog and level > 2:
        out.append(f"\n{parser.epilog}\n")
    subs = subcommands(parser)
    for name, sub_help, sp in subs:
        out.append("\n" + command(path + [name], sub_help, sp, globals_, level + 1))
    return "\n".join(x for x in out if x)


def render() -> str:
    """The whole page."""
    with fixed_width():
        parser = build_parser()
        globals_ = {a.dest for a in options(parser)}
        usage = parser.format_usage().removeprefix("usage: ").rstrip()
        top = (f"```text\n{usage}\n```\n\n{parser.description}\n\n"
               "## Global options\n\nAccepted before or after the command.\n\n"
               + options_table(parser)
               + f"\n```text\n{parser.epilog.strip()}\n```\n")
        summary = md.table(["command", "what it does"],
                           [[f"[{md.code(n)}](#coordctl-{n})", h]
                            for n, h, _ in subcommands(parser)])
        body = "\n".join(command(["coordctl", n], h, sp, globals_, 3)
                         for n, h, sp in subcommands(parser))
    return (md.header("coordctl", "coordctl/__main__.py's argparse parser",
                      "The admin command line of coordd. Exit codes: 0 ok; 1 the operation "
                      "was refused or failed (a coordd error code, coordd not running, a "
                      "failed check); 2 usage error. Every error is one stderr line: "
                      "`coordctl: <code>: <message>`.")
            + top + "\n## Commands\n\n" + summary + "\n" + EXAMPLE + "\n## Reference\n\n"
            + body)
