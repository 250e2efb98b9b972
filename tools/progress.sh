#!/usr/bin/env bash
# tools/progress.sh WHAT COMMAND [ARG...]: run COMMAND, saying what is being
# built and for how long so far, one line every PROGRESS_EVERY seconds
# (default 30), then how long it took. The long builds of `make test` (helm,
# the control plane: tens of minutes cold on a busy 2-core machine) use it,
# so a first run does not look hung. The exit status is COMMAND's.
set -uo pipefail
what=$1
shift
every=${PROGRESS_EVERY:-30}
start=$(date +%s)
echo "$what: building (first time: several minutes; then cached by the Go build cache)"
"$@" &
pid=$!
# The ticker sleeps in short steps so it ends promptly with the build.
(
	next=$((start + every))
	while kill -0 "$pid" 2>/dev/null; do
		now=$(date +%s)
		if [ "$now" -ge "$next" ]; then
			echo "$what: still building, $((now - start))s so far"
			next=$((next + every))
		fi
		sleep 1
	done
) &
ticker=$!
wait "$pid"
rc=$?
kill "$ticker" 2>/dev/null
wait "$ticker" 2>/dev/null
took=$(($(date +%s) - start))
if [ "$rc" -eq 0 ]; then
	echo "$what: done in ${took}s"
else
	echo "$what: FAILED after ${took}s (exit $rc)"
fi
exit "$rc"
