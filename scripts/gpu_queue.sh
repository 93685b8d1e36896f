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
    shift
    if [ -e "$q/pid" ] && [ ! -e "$q/ended" ] && kill -0 "$(cat "$q/pid")" 2>/dev/null; then
      echo "a queue is running (pid $(cat "$q/pid")): wait for it, or stop it first"; exit 2; fi
    rm -rf "$q"; mkdir -p "$q/out"
    printf '%s\n' "$@" > "$q/phases"
    # setsid -f, not `&`: a job started with & by a non-interactive shell ignores SIGINT, and so would every phase
    # under it (timeout's SIGINT and `stop` would not reach pytest, and engines would not close)
    setsid -f bash -c '
      echo $$ > '"$q"'/pid
      n=0
      while read -r line; do
        n=$((n + 1)); [ -e '"$q"'/stopped ] && break
        echo "$(date +%T) start $n: $line"
        mkdir -p '"$q"'/out/$n
        eval "OUT='"$q"'/out/$n bash scripts/gpu_session.sh $line" < /dev/null  # not the phases file
        for f in '"$q"'/out/$n/*.tgz; do mv "$f" '"$q"'/out/$(basename "$f" .tgz)-$n.tgz; done
        echo "$(date +%T) done $n: $line"
      done < '"$q"'/phases
      echo "$(date +%T) queue ended" ; touch '"$q"'/ended' > "$q/log" 2>&1 < /dev/null
    sleep 2; echo "queue started (pid $(cat "$q/pid" 2>/dev/null)): $# phases"; cat "$q/log" ;;
  wait)
    [ -d "$q" ] || { echo "no queue here (the machine was given back, or none was started): start one"; exit 2; }
    limit=${2:-570}; t0=$(date +%s)
    alive() { [ -e "$q/pid" ] && kill -0 "$(cat "$q/pid")" 2>/dev/null; }
    while [ ! -e "$q/ended" ] && alive && [ $(( $(date +%s) - t0 )) -lt "$limit" ]; do sleep 5; done
    alive || [ -e "$q/ended" ] || { echo "$(date +%T) the queue's runner is gone (stopped)" >> "$q/log"; touch "$q/ended"; }
    cp "$q"/out/*.tgz "${OUT:-/tmp}/" 2>/dev/null
    cp "$q/log" "${OUT:-/tmp}/queue.log"
    cat "$q/log"; [ -e "$q/ended" ] && echo "QUEUE ENDED" || { echo "queue still running: send wait again";
      tail -c 1500 /tmp/run-*/nbval.log /tmp/run-*/stdout.log /tmp/run-*/pytest.log 2>/dev/null | tail -n 15; } ;;
  stop)
    [ -e "$q/pid" ] || { echo "no queue to stop"; exit 2; }
    touch "$q/stopped"; kill -INT -- "-$(cat "$q/pid")" 2>/dev/null  # the queue's own process group (setsid)
    bash "$0" wait 80 ;;
  *) echo "usage: gpu_queue.sh start PHASE... | wait SECONDS | stop"; exit 2 ;;
esac
