"""The example workflow's three capabilities: gather -> narrate -> build.

Run as ``python -m worker.models.story STEP --payload P --result R`` with STEP one of:

- ``gather``: payload ``{"module": "json", "max_evidence": 5}``. Evidence from a
  standard-library module's documentation: the first sentence of the docstrings of its
  public functions and classes. Result ``{"module", "evidence": [{id, text, source}]}``.
- ``narrate``: reads ``inputs.gather`` (put there by coordd when gather succeeded) and
  writes claims in the ``claims`` result schema: one fact per piece of evidence, citing
  it, and one opinion. ``{"uncited": true}`` in the payload labels a claim a fact without
  evidence, which coordd's validator refuses (for drills of the dead-letter path).
- ``build``: reads ``inputs.narrate`` (and ``inputs.gather`` when present; the example
  graph runs build without it) and renders a Markdown report. Result ``{"title",
  "markdown", "facts", "sources"}``.

Any step sleeps `sleep_s` seconds first if its payload says so (for crash drills).
Exit 0 on success, 2 on a bad payload (permanent: a retry cannot help).
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import sys
import time
from typing import Any

from coordd.cas import write_atomic

EXIT_BAD_PAYLOAD = 2
MAX_EVIDENCE_DEFAULT = 5


def first_sentence(doc: str) -> str:
    text = " ".join(doc.strip().split("\n\n")[0].split())
    end = text.find(". ")
    return (text if end < 0 else text[:end + 1])[:300]


def gather(payload: dict[str, Any]) -> dict[str, Any]:
    module = payload.get("module")
    if not isinstance(module, str) or module not in sys.stdlib_module_names:
        raise ValueError(f"module must name a standard-library module, got {module!r}")
    limit = int(payload.get("max_evidence", MAX_EVIDENCE_DEFAULT))
    mod = importlib.import_module(module)
    evidence = []
    for name in sorted(getattr(mod, "__all__", None) or dir(mod)):
        obj = getattr(mod, name, None)
        if name.startswith("_") or not (inspect.isfunction(obj) or inspect.isclass(obj)):
            continue
        doc = inspect.getdoc(obj)
        if doc:
            evidence.append({"id": f"e{len(evidence) + 1}", "text": first_sentence(doc),
                             "source": f"{module}.{name}"})
        if len(evidence) >= limit:
            break
    return {"module": module, "evidence": evidence}


def narrate(payload: dict[str, Any]) -> dict[str, Any]:
    gathered = payload.get("inputs", {}).get("gather")
    if not isinstance(gathered, dict):
        raise ValueError("narrate needs inputs.gather (the gather node's result)")
    evidence = gathered.get("evidence", [])
    claims = [{"text": f"{e['source']}: {e['text']}", "label": "Fact", "evidence": [e["id"]]}
              for e in evidence]
    claims.append({"text": f"{gathered['module']} is worth a read", "label": "opinion"})
    if payload.get("uncited"):
        claims.append({"text": f"{gathered['module']} is the fastest", "label": "fact"})
    return {"title": f"About {gathered['module']}", "claims": claims, "evidence": evidence}


def build(payload: dict[str, Any]) -> dict[str, Any]:
    story = payload.get("inputs", {}).get("narrate")
    if not isinstance(story, dict):
        raise ValueError("build needs inputs.narrate (the narrate node's result)")
    facts = [c for c in story["claims"] if c["label"].strip().lower() == "fact"]
    lines = [f"# {story.get('title') or 'Report'}", ""]
    lines += [f"- {c['text']} [{', '.join(c['evidence'])}]" for c in facts]
    lines += ["", *[f"> {c['text']} ({c['label']})" for c in story["claims"]
                    if c not in facts]]
    gathered = payload.get("inputs", {}).get("gather")
    sources = [e["source"] for e in gathered["evidence"]] if isinstance(gathered, dict) else []
    if "gather" in payload.get("missing_inputs", []):
        lines += ["", "_sources unavailable: the gather step did not succeed_"]
    return {"title": story.get("title"), "markdown": "\n".join(lines) + "\n",
            "facts": len(facts), "sources": sources}


STEPS = {"gather": gather, "narrate": narrate, "build": build}


def main(argv: list[str] | None = None) -> int:
    """Entry point; see the module docstring."""
    p = argparse.ArgumentParser(prog="worker.models.story")
    p.add_argument("step", choices=sorted(STEPS))
    p.add_argument("--payload", required=True)
    p.add_argument("--result", required=True)
    args = p.parse_args(argv)
    try:
        with open(args.payload) as f:
            payload = json.load(f)
        if not isinstance(payload, dict):
            raise ValueError("payload must be a JSON object")
        time.sleep(float(payload.get("sleep_s", 0)))  # drills: a step that takes a while
        result = STEPS[args.step](payload)
    except (OSError, ValueError, KeyError, TypeError, ImportError) as exc:
        print(f"story {args.step}: bad payload: {exc}", file=sys.stderr)
        return EXIT_BAD_PAYLOAD
    write_atomic(args.result, json.dumps(result).encode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
