#!/usr/bin/env bash
# Make .venv with lablib installed (editable). `scripts/setup.sh test` adds the test tools.
# torch 2.13.0 is pinned for a CPU machine; on a GPU machine keep the torch your vLLM needs.
# `scripts/setup.sh quant` (a GPU machine, after `pip install -e '.[gpu]'` in .venv): lab 06's quantization
# environment, .venv-quant. llm-compressor 0.14 pins compressed-tensors 0.19 and vLLM 0.26 pins 0.17, so they
# cannot share .venv; .venv-quant sees .venv's packages (torch, transformers: nothing downloaded twice) behind its
# own, where llm-compressor and its compressed-tensors go. lablib finds it by itself (lablib.models.quantize).
set -euo pipefail
cd "$(dirname "$0")/.."
extra="${1:-}"
if [ "$extra" = "quant" ]; then
  [ -x .venv/bin/python ] || { echo "setup.sh quant: make .venv first (scripts/setup.sh), then run this again"; exit 2; }
  [ -x .venv-quant/bin/python ] || .venv/bin/python -m venv .venv-quant
  base=$(.venv/bin/python -c "import sysconfig; print(sysconfig.get_path('purelib'))")
  own=$(.venv-quant/bin/python -c "import sysconfig; print(sysconfig.get_path('purelib'))")
  echo "$base" > "$own/zz-lablib-venv.pth"  # .venv's packages after .venv-quant's own (.pth paths go last)
  .venv-quant/bin/python -m pip install -q --upgrade pip
  .venv-quant/bin/python -m pip install -q "llmcompressor==0.14.0.1" 2>&1 | grep -v "incompatible\|dependency conflicts\|vllm" || true
  .venv-quant/bin/python -c "import llmcompressor, compressed_tensors; print('quantization environment ready:', \
    '.venv-quant, llmcompressor', llmcompressor.__version__, 'compressed-tensors', compressed_tensors.__version__)"
  exit 0
fi
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -c "import torch" 2>/dev/null || .venv/bin/python -m pip install -q "torch==2.13.0"
if [ "$extra" = "test" ]; then
  .venv/bin/python -m pip install -q -e ".[test]"
else
  .venv/bin/python -m pip install -q -e .
fi
# Notebooks: outputs stripped on commit by nbstripout, a git filter git treats as required once enabled. Enable it
# only where .venv has nbstripout (`setup.sh test`, or the [lab] extras): an enabled filter that is missing makes
# `git status` and `git diff` fail with "clean filter 'nbstripout' failed".
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  if .venv/bin/python -c "import nbstripout" 2>/dev/null; then
    git config --local --replace-all include.path "$PWD/.nbstripout.gitconfig" nbstripout
  else
    git config --local --unset-all include.path nbstripout || true
  fi
fi
