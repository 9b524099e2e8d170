"""P0..P2 requests: the keywords of a standard-library module's documentation.

Run as ``python -m worker.models.keywords --payload P --result R``. Payload:
``{"module": "json", "top": 10}``. It reads the docstrings of the module and its public
members (the same corpus builder as the `train` model), and ranks words by TF-IDF against
the documentation of a fixed reference set of modules. Result:
``{"module", "words", "top": [[word, score], ...], "summary"}`` where summary is the first
sentence of the module docstring. Exit 0 on success, 2 on a bad payload.
"""

from __future__ import annotations

import argparse
import collections
import importlib.util
import inspect
import json
import math
import re
import sys
from typing import Any

from coordd.cas import write_atomic
from worker.models.train import MODULES_DEFAULT, build_corpus

EXIT_BAD_PAYLOAD = 2
TOP_DEFAULT = 10
TOP_MAX = 100
WORD = re.compile(r"[a-z][a-z_]{2,}")
STOP = frozenset("""the and for that this with are from not its can any all but has have
into their them than then there these they was were will when which while who whom why
you your our use used uses using return returns returned object objects value values
default none true false also may must one two new see each other such only more most
""".split())


def words(text: str) -> list[str]:
    """Lower-case words of three or more letters, without stop words."""
    return [w for w in WORD.findall(text.lower()) if w not in STOP]


def keywords(module: str, top: int) -> dict[str, Any]:
    """Rank `module`'s documentation words by TF-IDF over the reference modules.

    Raises:
        ValueError: `module` is not an importable standard-library module.
    """
    if module not in sys.stdlib_module_names or importlib.util.find_spec(module) is None:
        raise ValueError(f"{module!r} is not a standard-library module here")
    docs = {m: collections.Counter(words(build_corpus([m])))
            for m in sorted(set(MODULES_DEFAULT) | {module})}
    tf = docs[module]
    total = sum(tf.values()) or 1
    n_docs = len(docs)
    scored = []
    for word, count in tf.items():
        df = sum(1 for c in docs.values() if word in c)
        scored.append((word, round(count / total * math.log((1 + n_docs) / (1 + df)) * 1000, 3)))
    scored.sort(key=lambda ws: (-ws[1], ws[0]))
    doc = inspect.getdoc(importlib.import_module(module)) or ""
    summary = doc.strip().split("\n\n")[0].replace("\n", " ")[:200]
    return {"module": module, "words": total, "top": scored[:top], "summary": summary}


def main(argv: list[str] | None = None) -> int:
    """Entry point; see the module docstring."""
    p = argparse.ArgumentParser(prog="worker.models.keywords")
    p.add_argument("--payload", required=True)
    p.add_argument("--result", required=True)
    args = p.parse_args(argv)
    try:
        with open(args.payload) as f:
            payload = json.load(f)
        if not isinstance(payload, dict) or not isinstance(payload.get("module"), str):
            raise ValueError('payload must be {"module": str, "top"?: int}')
        top = payload.get("top", TOP_DEFAULT)
        if isinstance(top, bool) or not isinstance(top, int) or not 1 <= top <= TOP_MAX:
            raise ValueError(f"top must be an integer 1..{TOP_MAX}")
        result = keywords(payload["module"], top)
    except (OSError, ValueError) as exc:
        print(f"keywords: bad payload: {exc}", file=sys.stderr)
        return EXIT_BAD_PAYLOAD
    write_atomic(args.result, json.dumps(result).encode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
