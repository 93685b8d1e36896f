#!/usr/bin/env bash
# A queue of gpu_session.sh phases that outlives one device command (a command may run 10 min; lab 07 live takes
# longer). The queue runs in its own process session (setsid), which the device machine keeps running between
# commands while it stays held, so send `wait` again at once each time it returns (the machine is given back
# after 30 s idle):
#
#   bash scripts/gpu_queue.sh start "labs 900 labs/07_prefix_caching.ipynb" 'tests 300 -k "not 8b"'
#   bash scripts/gpu_queue.sh wait 570     # until the queue ends or 570 s pass; copies each finished phase's
#                                          # <phase>-<n>.tgz and the queue's log to $OUT
#   bash scripts/gpu_queue.sh stop         # SIGINT to the running phase (engines close), the rest skipped
set -u
q=/tmp/gpu-queue
case ${1:-} in
  start)
    shift; rm -rf "$q"; mkdir -p "$q/out"
    printf '%s\n' "$@" > "$q/phases"
    setsid bash -c '
      n=0
      while read -r line; do
        n=$((n + 1)); [ -e '"$q"'/stopped ] && break
        echo "$(date +%T) start $n: $line"
        mkdir -p '"$q"'/out/$n
        eval "OUT='"$q"'/out/$n bash scripts/gpu_session.sh $line"
        for f in '"$q"'/out/$n/*.tgz; do mv "$f" '"$q"'/out/$(basename "$f" .tgz)-$n.tgz; done
        echo "$(date +%T) done $n: $line"
      done < '"$q"'/phases
      echo "$(date +%T) queue ended" ; touch '"$q"'/ended' > "$q/log" 2>&1 < /dev/null &
    echo "queue started (pid $!): $# phases"; sleep 2; cat "$q/log" ;;
  wait)
    limit=${2:-570}; t0=$(date +%s)
    while [ ! -e "$q/ended" ] && [ $(( $(date +%s) - t0 )) -lt "$limit" ]; do sleep 5; done
    cp "$q"/out/*.tgz "${OUT:-/tmp}/" 2>/dev/null
    cp "$q/log" "${OUT:-/tmp}/queue.log"
    cat "$q/log"; [ -e "$q/ended" ] && echo "QUEUE ENDED" || { echo "queue still running: send wait again";
      tail -c 1500 /tmp/run-*/nbval.log /tmp/run-*/stdout.log /tmp/run-*/pytest.log 2>/dev/null | tail -n 15; } ;;
  stop)
    touch "$q/stopped"; pkill -INT -f "scripts/gpu_session.sh" ; pkill -INT -f "pytest" ; pkill -INT -f record_reference
    sleep 20; bash "$0" wait 60 ;;
  *) echo "usage: gpu_queue.sh start PHASE... | wait SECONDS | stop"; exit 2 ;;
esac
