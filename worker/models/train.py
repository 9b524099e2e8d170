"""P3 idle learning: train a character n-gram language model on standard-library docstrings.

Run as ``python -m worker.models.train --payload P --result R --checkpoint-dir D --resume-from F``.
Exit 0 on success, 2 on a bad payload or checkpoint (permanent), 75 on SIGTERM (retryable).

Everything is sorted and seeded so that a run resumed from any checkpoint ends with the same
counts, byte for byte, as an uninterrupted run on the same Python version.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib
import inspect
import json
import logging
import math
import os
import random
import signal
import sys
import threading
import time
from typing import Any

from coordd.cas import write_atomic

logger = logging.getLogger(__name__)

EXIT_OK = 0
EXIT_BAD_PAYLOAD = 2
EXIT_RETRYABLE = 75
ORDER_DEFAULT = 4
ORDER_MAX = 8
SEED_DEFAULT = 0
CHECKPOINT_EVERY_DEFAULT = 10
CHUNK_CHARS = 512
"""One step trains on one chunk of this many corpus characters."""
HELDOUT_FRACTION = 0.1
HELDOUT_EVAL_CHARS = 20_000
"""Perplexity is measured on at most this many held-out characters, to bound run time."""
ADD_K = 0.1
SAMPLE_CHARS = 80
SAMPLE_PROMPT = "Return the "
KEEP_CHECKPOINTS = 3
KEEP_YOUNGER_S = 3.0
"""A checkpoint younger than this is kept even past KEEP_CHECKPOINTS: the supervisor takes a
file only once it held still for worker.checkpoints.SETTLE_S (1 s), so a fast model that
deleted its files sooner would never have one recorded."""
CHECKPOINT_VERSION = 1
BOS = "\x02"
"""Pads the context at the start of each chunk."""
MODULES_DEFAULT = (
    "abc", "argparse", "ast", "base64", "bisect", "calendar", "collections", "contextlib",
    "copy", "csv", "dataclasses", "datetime", "decimal", "difflib", "enum", "fractions",
    "functools", "heapq", "inspect", "itertools", "json", "logging", "operator", "pathlib",
    "pickle", "random", "shlex", "statistics", "string", "textwrap", "typing", "zipfile",
)  # fmt: skip


class BadPayload(Exception):
    """The payload or the checkpoint to resume from cannot be used."""


class Config:
    """Validated payload."""

    def __init__(self, raw: Any) -> None:
        """Check ``raw`` (the decoded payload JSON).

        Raises:
            BadPayload: On a missing or ill-typed field.
        """
        if not isinstance(raw, dict):
            raise BadPayload("payload must be a JSON object")
        self.steps = _int(raw, "steps", None, 1)
        self.order = _int(raw, "order", ORDER_DEFAULT, 1, ORDER_MAX)
        self.seed = _int(raw, "seed", SEED_DEFAULT, None)
        self.checkpoint_every = _int(raw, "checkpoint_every", CHECKPOINT_EVERY_DEFAULT, 1)
        delay = raw.get("step_delay_s", 0.0)
        if isinstance(delay, bool) or not isinstance(delay, int | float) or not 0 <= delay < math.inf:
            raise BadPayload("step_delay_s must be a number >= 0")
        self.step_delay_s = float(delay)
        modules = raw.get("modules", list(MODULES_DEFAULT))
        if not isinstance(modules, list) or not modules or not all(isinstance(m, str) and m for m in modules):
            raise BadPayload("modules must be a non-empty list of module names")
        foreign = [m for m in modules if m.partition(".")[0] not in sys.stdlib_module_names]
        if foreign:
            raise BadPayload(f"modules must be standard-library modules, not {sorted(set(foreign))}")
        self.modules = sorted(set(modules))


def _int(raw: dict[str, Any], key: str, default: int | None, lo: int | None, hi: int | None = None) -> int:
    value = raw.get(key, default)
    if value is None:
        raise BadPayload(f"{key} is required")
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadPayload(f"{key} must be an integer")
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        raise BadPayload(f"{key} must be in [{lo}, {hi if hi is not None else 'inf'}], got {value}")
    return value


def build_corpus(modules: list[str]) -> str:
    """Return the docstrings of ``modules`` and their public members, in sorted order.

    Raises:
        BadPayload: If a module cannot be imported.
    """
    parts: list[str] = []
    for name in sorted(modules):
        try:
            module = importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - any import failure makes the payload unusable
            raise BadPayload(f"cannot import module {name!r}: {exc}") from exc
        docs = [inspect.getdoc(module) or ""]
        for attr in sorted(vars(module)):
            obj = getattr(module, attr)
            if attr.startswith("_") or getattr(obj, "__module__", None) != name:
                continue
            if inspect.isclass(obj) or inspect.isroutine(obj):
                docs.append(inspect.getdoc(obj) or "")
            if inspect.isclass(obj):
                for meth in sorted(vars(obj)):
                    member = vars(obj)[meth]
                    if not meth.startswith("_") and inspect.isroutine(member):
                        docs.append(inspect.getdoc(member) or "")
        parts.extend(d.strip() for d in docs if d.strip())
    return "\n\n".join(parts) + "\n"


class Model:
    """Counts of the next character after each context of length 0..order-1."""

    def __init__(self, order: int, counts: dict[str, dict[str, int]] | None = None) -> None:
        """Create an empty model, or one holding ``counts`` (from a checkpoint)."""
        self.order = order
        self.counts: dict[str, dict[str, int]] = counts if counts is not None else {}

    def train(self, chunk: str) -> None:
        """Add every (context, next char) pair of ``chunk``."""
        text = BOS * (self.order - 1) + chunk
        pad = self.order - 1
        for i in range(pad, len(text)):
            char = text[i]
            for n in range(self.order):
                ctx = text[i - n : i]
                row = self.counts.setdefault(ctx, {})
                row[char] = row.get(char, 0) + 1

    def canonical(self) -> bytes:
        """Serialize the counts canonically (sorted keys, no whitespace, UTF-8)."""
        return json.dumps(self.counts, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()

    def sha256(self) -> str:
        """Return the sha256 of ``canonical()`` as hex."""
        return hashlib.sha256(self.canonical()).hexdigest()

    def perplexity(self, text: str, vocab_size: int) -> float:
        """Return per-character perplexity of ``text`` under add-k smoothing at full order."""
        padded = BOS * (self.order - 1) + text
        pad = self.order - 1
        log_sum = 0.0
        for i in range(pad, len(padded)):
            row = self.counts.get(padded[i - pad : i], {})
            total = sum(row.values())
            prob = (row.get(padded[i], 0) + ADD_K) / (total + ADD_K * vocab_size)
            log_sum += math.log(prob)
        return math.exp(-log_sum / max(1, len(text)))

    def sample(self, prompt: str, length: int, seed: int) -> str:
        """Generate ``length`` characters after ``prompt``, backing off to shorter seen contexts."""
        rng = random.Random(seed)
        out = BOS * (self.order - 1) + prompt
        for _ in range(length):
            for n in range(self.order - 1, -1, -1):
                row = self.counts.get(out[len(out) - n :] if n else "")
                if row:
                    chars = sorted(row)
                    out += rng.choices(chars, weights=[row[c] for c in chars])[0]
                    break
            else:
                break
        return out[self.order - 1 :]


def chunk_schedule(train_text: str, steps: int, seed: int) -> list[int]:
    """Return the chunk start offset used at each step: shuffled per epoch, seeded."""
    starts = list(range(0, len(train_text), CHUNK_CHARS))
    order: list[int] = []
    epoch = 0
    while len(order) < steps:
        perm = starts[:]
        random.Random(seed * 1_000_003 + epoch).shuffle(perm)
        order.extend(perm)
        epoch += 1
    return order[:steps]


def save_checkpoint(directory: str, step: int, cfg: Config, corpus_sha: str, model: Model) -> str:
    """Write ``ckpt-<step>.json`` atomically, prune old ones (beyond the newest
    KEEP_CHECKPOINTS, once KEEP_YOUNGER_S old), and return its path."""
    state = {
        "version": CHECKPOINT_VERSION,
        "step": step,
        "order": cfg.order,
        "seed": cfg.seed,
        "chunk_chars": CHUNK_CHARS,
        "corpus_sha256": corpus_sha,
        "counts": model.counts,
    }
    path = os.path.join(directory, f"ckpt-{step:08d}.json")
    write_atomic(path, json.dumps(state, sort_keys=True, ensure_ascii=False).encode())
    old = sorted(n for n in os.listdir(directory) if n.startswith("ckpt-") and n.endswith(".json"))
    now = time.time()
    for name in old[:-KEEP_CHECKPOINTS]:
        with contextlib.suppress(OSError):
            if now - os.stat(os.path.join(directory, name)).st_mtime >= KEEP_YOUNGER_S:
                os.unlink(os.path.join(directory, name))
    return path


def load_checkpoint(path: str, cfg: Config, corpus_sha: str) -> tuple[int, Model]:
    """Return (step, model) from ``path`` after checking it matches this payload and corpus.

    Raises:
        BadPayload: If the file is unreadable or was written for other settings.
    """
    try:
        with open(path, encoding="utf-8") as fh:
            state = json.load(fh)
    except (OSError, ValueError) as exc:
        raise BadPayload(f"cannot read checkpoint {path}: {exc}") from exc
    expected = {"version": CHECKPOINT_VERSION, "order": cfg.order, "seed": cfg.seed,
                "chunk_chars": CHUNK_CHARS, "corpus_sha256": corpus_sha}  # fmt: skip
    if not isinstance(state, dict):
        raise BadPayload(f"checkpoint {path} is not a JSON object")
    for key, want in expected.items():
        if state.get(key) != want:
            raise BadPayload(f"checkpoint {path} has {key}={state.get(key)!r}, this run needs {want!r}")
    step = state.get("step")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0 or not isinstance(state.get("counts"), dict):
        raise BadPayload(f"checkpoint {path} has no valid step/counts")
    return step, Model(cfg.order, state["counts"])


class Stop:
    """Set by SIGTERM; lets the step delay end at once."""

    def __init__(self) -> None:
        """Create an unset stop flag."""
        self.event = threading.Event()

    def install(self) -> None:
        """Route SIGTERM to this flag."""
        signal.signal(signal.SIGTERM, lambda _sig, _frame: self.event.set())


def run(cfg: Config, result_path: str, checkpoint_dir: str, resume_from: str, stop: Stop) -> int:
    """Train, checkpoint and write the result; return the exit code.

    Raises:
        BadPayload: On an unusable corpus, checkpoint or directory.
    """
    corpus = build_corpus(cfg.modules)
    corpus_sha = hashlib.sha256(corpus.encode()).hexdigest()
    split = int(len(corpus) * (1 - HELDOUT_FRACTION))
    train_text, heldout = corpus[:split], corpus[split:]
    if not train_text or not heldout:
        raise BadPayload("corpus too small")
    if not os.path.isdir(checkpoint_dir):
        raise BadPayload(f"checkpoint dir {checkpoint_dir!r} does not exist")
    start, model = (0, Model(cfg.order)) if not resume_from else load_checkpoint(resume_from, cfg, corpus_sha)
    schedule = chunk_schedule(train_text, cfg.steps, cfg.seed)
    for step in range(start, cfg.steps):
        if stop.event.is_set():
            return EXIT_RETRYABLE
        offset = schedule[step]
        model.train(train_text[offset : offset + CHUNK_CHARS])
        done = step + 1
        if done % cfg.checkpoint_every == 0 and done < cfg.steps:
            path = save_checkpoint(checkpoint_dir, done, cfg, corpus_sha, model)
            print(json.dumps({"event": "checkpoint", "step": done, "path": path}), flush=True)
        if cfg.step_delay_s and stop.event.wait(cfg.step_delay_s):
            return EXIT_RETRYABLE
    if stop.event.is_set():
        return EXIT_RETRYABLE
    result = {
        "steps": cfg.steps,
        "order": cfg.order,
        "model_sha256": model.sha256(),
        "perplexity": round(model.perplexity(heldout[:HELDOUT_EVAL_CHARS], len(set(corpus)) + 1), 6),
        "sample": model.sample(SAMPLE_PROMPT, SAMPLE_CHARS, cfg.seed),
        "resumed_from_step": start,
    }
    write_atomic(result_path, json.dumps(result, sort_keys=True).encode())
    return EXIT_OK


def read_payload(path: str) -> Any:
    """Return the decoded payload JSON.

    Raises:
        BadPayload: If the file is unreadable or not JSON.
    """
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except (OSError, ValueError) as exc:
        raise BadPayload(f"cannot read {path}: {exc}") from exc


def main(argv: list[str] | None = None) -> int:
    """Parse argv, run, and map failures to exit codes."""
    parser = argparse.ArgumentParser(prog="python -m worker.models.train", description=__doc__.splitlines()[0])
    parser.add_argument("--payload", required=True, help="payload JSON file")
    parser.add_argument("--result", required=True, help="result JSON file to write")
    parser.add_argument("--checkpoint-dir", required=True, help="directory for ckpt-<step>.json")
    parser.add_argument("--resume-from", default="", help="checkpoint to resume from, or empty")
    args = parser.parse_args(argv)
    stop = Stop()
    stop.install()
    try:
        cfg = Config(read_payload(args.payload))
        return run(cfg, args.result, args.checkpoint_dir, args.resume_from, stop)
    except BadPayload as exc:
        print(f"bad payload: {exc}", file=sys.stderr)
        return EXIT_BAD_PAYLOAD
    except OSError as exc:  # e.g. a full disk: another attempt, maybe elsewhere, may succeed
        print(f"I/O error: {exc}", file=sys.stderr)
        return EXIT_RETRYABLE


if __name__ == "__main__":
    sys.exit(main())
