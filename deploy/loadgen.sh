#!/bin/sh
# The demo's load generator (deploy/compose.yaml): `loadshed bench` in open loop at
# $RATE requests per second (Poisson arrivals) against $TARGET, each request with a
# client timeout of $TIMEOUT sent as its deadline (X-Request-Timeout), in runs of
# $PERIOD, forever: each run prints its report (throughput, goodput, latency) to the
# container's log, and the dashboard sees a continuous stream.
#
# $MALFORMED_RATE (requests per second, 0: none) adds a trickle of requests whose
# X-Request-Timeout is not a number, so that the dashboard's malformed-headers panel
# has something to show; loadshed ignores such a header and counts it.
set -u
: "${TARGET:?TARGET: the URL to load}"
: "${RATE:=160}"
: "${TIMEOUT:=1s}"
: "${PERIOD:=60s}"
: "${MALFORMED_RATE:=1}"

pids=""
stop() {
    [ -n "$pids" ] && kill $pids 2>/dev/null
    exit 0
}
trap stop INT TERM

while :; do
    pids=""
    if [ "$MALFORMED_RATE" != 0 ]; then
        loadshed bench "$TARGET" --rate "$MALFORMED_RATE" --duration "$PERIOD" --warmup 0s \
            --timeout "$TIMEOUT" --header 'X-Request-Timeout: soon' --max-lag 1s --quiet \
            >/dev/null 2>&1 &
        pids="$!"
    fi
    loadshed bench "$TARGET" --rate "$RATE" --arrival poisson --duration "$PERIOD" \
        --warmup 0s --timeout "$TIMEOUT" --send-deadline --max-lag 1s --quiet &
    pids="$pids $!"
    wait
    sleep 1
done
