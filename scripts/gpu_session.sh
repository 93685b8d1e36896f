#!/usr/bin/env bash
# One phase of GPU work on the lent GPU machine, after ../shared/gpu/stage installed vLLM into /tmp/site:
#
#   bash scripts/gpu_session.sh tests  SECONDS [ARGS...]  pytest -m gpu tests/test_gpu_vllm.py ARGS (6 tests, ~10 min on an
#                                                         H200: run it as two commands, -k "not 8b" then -k 8b)
#   bash scripts/gpu_session.sh labs   SECONDS NB...      notebooks under nbval, live (e.g. labs/03_kv_cache.ipynb)
#   bash scripts/gpu_session.sh record SECONDS STEPS      scripts/record_reference.py --steps STEPS
#   bash scripts/gpu_session.sh lablab SECONDS [ARGS...]  the main job (lablab ARGS: by default the real-size ladder the
#                                                         GPU holds), its Results, summary and report packed
#
# Each phase stops itself (SIGINT, so engines and servers close; SIGKILL 90 s later: a vLLM engine may take
# a minute to close, and a recording writes what it measured only once its engine has) after SECONDS, then packs its logs,
# results and the workers' logs into ONE file, $OUT/<phase>.tgz ($OUT brings back at most 8 files).
set -u
phase=$1; budget=$2; shift 2
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0
[ -d /tmp/site-q ] && export LABLIB_QUANT_SITE=/tmp/site-q  # lab 06's quantizer: llm-compressor's own packages
run=/tmp/run-$phase; mkdir -p "$run"
t0=$(date +%s)
case $phase in
  tests)  LABLIB_GPU_OUT=$run timeout -s INT -k 90 "$budget" python -m pytest -m gpu -v -rs --durations=0 tests/test_gpu_vllm.py "$@" 2>&1 | tee "$run/pytest.log" ;;
  labs)   timeout -s INT -k 90 "$budget" python -m pytest -v -rs --durations=0 "$@" 2>&1 | tee "$run/nbval.log"
          mkdir -p "$run/results" && cp results/*.jsonl "$run/results/" 2>/dev/null  # the labs' live Results,
          cp results/facts-*.json "$run/results/" 2>/dev/null ;;  # and the studies a live lab records (keep_facts)
  record) timeout -s INT -k 90 "$budget" python scripts/record_reference.py --out "$run" --steps "$1" 2>&1 | tee "$run/stdout.log" ;;
  lablab) timeout -s INT -k 90 "$budget" python -c 'import sys; from lablib.cli import main; sys.exit(main())' \
            --results "$run/results" --report "$run/journey.html" "$@" 2>&1 | tee "$run/stdout.log" ;;
  *) echo "unknown phase $phase: tests, labs, record or lablab"; exit 2 ;;
esac
echo "phase $phase: $(( $(date +%s) - t0 )) s" | tee -a "$run/phase.txt"
nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv >> "$run/phase.txt" 2>&1
cp /tmp/lablib-vllm-*.log /tmp/vllm-server-*.log "$run/" 2>/dev/null
tar czf "${OUT:-/tmp}/$phase.tgz" -C "$run" .
