#!/usr/bin/env bash
# Allocations per routed request in the running router, read from outside:
# runs `pdplane bench compare` against pdplane alone and, in the middle of
# its window, reads the serve process's own counters (Go's mallocs and
# allocated bytes, the router's requests) from /metrics twice, 5 s apart.
#
#   scripts/bench-allocs.sh [PDPLANE_BINARY] [stream|unary]
set -euo pipefail
bin=${1:-$(mktemp -d)/pdplane}
mode=${2:-stream}
if [[ ! -x $bin ]]; then
	go build -o "$bin" ./cmd/pdplane
fi
log=$(mktemp)
"$bin" bench compare --peers "" --mode "$mode" --concurrency 32 --duration 14s --rounds 1 --held-streams 0 >"$log" 2>&1 &
harness=$!
for _ in $(seq 1 60); do
	sleep 1
	grep -q 'starting' "$log" && break
done
sleep 7
addr=$(ps -o args= --ppid "$harness" | sed -nE 's/.* serve --addr ([0-9.:]+).*/\1/p' | head -1)
if [[ -z $addr ]]; then
	echo "bench-allocs: no pdplane serve found under the harness; its output:" >&2
	cat "$log" >&2
	exit 1
fi
snap() {
	curl -fsS "http://$addr/metrics" | awk '
		/^go_memstats_mallocs_total/ {m = $2}
		/^go_memstats_alloc_bytes_total/ {b = $2}
		/^pdplane_router_requests_total/ {r += $2}
		END {printf "%d %d %d\n", m, b, r}'
}
read -r m1 b1 r1 < <(snap)
sleep 5
read -r m2 b2 r2 < <(snap)
wait "$harness"
if ((r2 == r1)); then
	echo "bench-allocs: no request was served in the 5 s window; the harness's output:" >&2
	cat "$log" >&2
	exit 1
fi
echo "$mode: $((r2 - r1)) requests, $(((m2 - m1) / (r2 - r1))) allocations and $(((b2 - b1) / (r2 - r1))) bytes per request"
