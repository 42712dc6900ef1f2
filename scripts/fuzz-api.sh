#!/usr/bin/env bash
# fuzz-api.sh: property-based fuzzing of the HTTP API against openapi.yaml.
# Builds pdplane, starts `pdplane serve` (in-memory store, tokens set) on a
# free loopback port, and runs schemathesis's every check over every
# operation with a fixed seed and a bounded number of examples. Exits non-zero
# on any disagreement between the server and the spec.
#
# Environment:
#   PDPLANE_ST          the `st` command (default: installed into .venv by
#                       scripts/install-schemathesis.sh)
#   FUZZ_SEED           seed (default 1); FUZZ_EXAMPLES examples per operation
#                       and phase (default 15)
#   CI=true             a schemathesis that cannot be installed is a failure;
#                       otherwise the fuzz run is skipped with a message.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

st=${PDPLANE_ST:-}
if [ -z "$st" ]; then
	if ! st=$(scripts/install-schemathesis.sh | tail -n 1) || [ ! -x "$st" ]; then
		if [ "${CI:-}" = true ]; then
			echo "fuzz-api: schemathesis could not be installed; under CI=true it is required" >&2
			exit 1
		fi
		echo "fuzz-api: schemathesis is not available; skipping the spec fuzz run" >&2
		exit 0
	fi
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/pdplane-fuzz.XXXXXX")
pid=
cleanup() {
	if [ -n "$pid" ]; then kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi
	rm -rf "$work"
}
trap cleanup EXIT

go build -o "$work/pdplane" ./cmd/pdplane
port=$("$root/.venv/bin/python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])' 2>/dev/null ||
	python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
base="http://127.0.0.1:$port"
# The environment must not change what is fuzzed.
env -u PDPLANE_DATABASE_URL -u PDPLANE_API_KEYS -u PDPLANE_ALLOWED_HOSTS \
	"$work/pdplane" serve --addr "127.0.0.1:$port" --admin-token fuzz-admin --join-token fuzz-join \
	--log-level error >"$work/serve.log" 2>&1 &
pid=$!
for _ in $(seq 100); do
	if curl -fsS "$base/healthz" >/dev/null 2>&1; then break; fi
	if ! kill -0 "$pid" 2>/dev/null; then cat "$work/serve.log" >&2; exit 1; fi
	sleep 0.1
done

cd "$work"
status=0
"$st" --config-file "$root/scripts/schemathesis.toml" run "$root/openapi.yaml" \
	--url "$base" --header "Authorization: Bearer fuzz-admin" \
	--checks all --seed "${FUZZ_SEED:-1}" --max-examples "${FUZZ_EXAMPLES:-15}" \
	--workers 1 --request-timeout 10 --no-color --output-truncate true || status=$?
if ! kill -0 "$pid" 2>/dev/null; then
	echo "fuzz-api: pdplane serve died during the run:" >&2
	cat "$work/serve.log" >&2
	exit 1
fi
exit "$status"
