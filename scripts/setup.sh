#!/usr/bin/env bash
# Make .venv with lablib installed (editable). `scripts/setup.sh test` adds the test tools.
# torch 2.13.0 is pinned for a CPU machine; on a GPU machine keep the torch your vLLM needs.
set -euo pipefail
cd "$(dirname "$0")/.."
extra="${1:-}"
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -c "import torch" 2>/dev/null || .venv/bin/python -m pip install -q "torch==2.13.0"
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then  # notebooks: outputs stripped on commit (nbstripout)
  git config --local --replace-all include.path "$PWD/.nbstripout.gitconfig" nbstripout
fi
if [ "$extra" = "test" ]; then
  .venv/bin/python -m pip install -q -e ".[test]"
else
  .venv/bin/python -m pip install -q -e .
fi
