#!/usr/bin/env bash
# The main job in one command: install into .venv (first run only), then run the demo batch.
set -euo pipefail
cd "$(dirname "$0")"
if [ ! -x .venv/bin/coordd ]; then
  python3 -m venv .venv
  .venv/bin/pip install -q -e .
fi
exec .venv/bin/python -m worker.demo "$@"
