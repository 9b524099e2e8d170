#!/usr/bin/env bash
# The main job in one command: install into .venv (first run only), then run the demo batch.
set -euo pipefail
cd "$(dirname "$0")"
if [ ! -x .venv/bin/coordd ]; then
  echo "first run: creating .venv and installing coordd and its dependencies into it" \
       "(pip, 10-40 s; later runs start at once)"
  python3 -m venv .venv
  .venv/bin/pip install -q -e .
  echo "installed; starting the demo"
fi
exec .venv/bin/python -m worker.demo "$@"
