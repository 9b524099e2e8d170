"""`python -m docgen [--check]`: rewrite the generated reference pages (docs/reference/);
with `--check`, change nothing and exit 1 if any is stale."""

from __future__ import annotations

import argparse
import sys

from docgen.pages import ROOT, render_all


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m docgen", description=__doc__)
    p.add_argument("--check", action="store_true", help="only report stale pages (exit 1)")
    args = p.parse_args(argv)
    stale = []
    for rel, text in render_all().items():
        path = ROOT / rel
        if path.exists() and path.read_text() == text:
            continue
        stale.append(rel)
        if not args.check:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    for rel in stale:
        print(f"{'stale' if args.check else 'wrote'} {rel}")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
