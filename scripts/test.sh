#!/usr/bin/env bash
# All set-up and all tests: what `make test` runs.
#  - PostgreSQL: uses $PDPLANE_TEST_DATABASE_URL, or starts a throwaway server
#    under .tmp/pg and stops it afterwards.
#  - NIXL: installs the nixl-cu12 wheel into .venv and points
#    $PDPLANE_NIXL_LIB at its libnixl_capi.so (pdplane finds .venv by itself
#    from the checkout's root; `go test` runs in each package's folder).
#  - hadolint: installed into .venv for the Dockerfile check in deploy/.
#  - pyzmq: installed into .venv for the sims' libzmq interop tests.
#  - SMG and vllm-router: installed into .venv for the interop tests, which
#    run the simulators behind them and pdplane behind SMG.
#  - Chromium: found on PATH (Debian's `chromium`) for the browser test.
#  - schemathesis: installed into .venv by scripts/install-schemathesis.sh
#    for the spec fuzz run (scripts/fuzz-api.sh).
#  - vLLM: its CPU build with NIXL, into .venv-vllm by
#    scripts/install-vllm.sh (~7 GB, ~5 min the first time), for the
#    real-engine suite (./realengine), which runs in a step of its own after
#    the race tests: two vLLM engines take both cores.
# Under CI=true nothing may be skipped: a missing PostgreSQL, NIXL, Chromium, hadolint, pyzmq,
# schemathesis or vLLM fails the run.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

step() { printf '\n==> %s\n' "$*"; }

step "go vet"
go vet ./...

step "staticcheck"
go tool staticcheck ./...

if [ -z "${PDPLANE_TEST_DATABASE_URL:-}" ]; then
  step "starting a throwaway PostgreSQL"
  # Under /tmp, not the checkout: as root the server runs as user postgres,
  # which may not be allowed into the folder the checkout lives in.
  pgdir=$(mktemp -d "${TMPDIR:-/tmp}/pdplane-test-pg.XXXXXX")
  chmod 755 "$pgdir"
  trap 'scripts/pg-stop.sh "$pgdir" || true; rm -rf "$pgdir"' EXIT
  PDPLANE_TEST_DATABASE_URL=$(scripts/pg-start.sh "$pgdir" | tail -n 1)
  export PDPLANE_TEST_DATABASE_URL
  echo "PDPLANE_TEST_DATABASE_URL=$PDPLANE_TEST_DATABASE_URL"
fi

# install_tool VAR SCRIPT TEST WHAT [WHY]: unless $VAR is set, runs SCRIPT
# (an install-*.sh) and exports VAR as the path it prints last, when
# `test TEST path` holds; under CI=true a failed install ends the run.
install_tool() {
  local var=$1 script=$2 check=$3 what=$4 why=${5:-} path
  if [ -n "${!var:-}" ] || [ ! -x "$script" ]; then
    return 0
  fi
  step "installing $what into .venv${why:+ ($why)}"
  if path=$("$script" | tail -n 1) && test "$check" "$path"; then
    export "$var=$path"
    echo "$var=$path"
  elif [ "${CI:-}" = true ]; then
    echo "$what could not be installed; under CI=true it is required" >&2
    exit 1
  fi
}

install_tool PDPLANE_NIXL_LIB scripts/install-nixl.sh -f NIXL
install_tool PDPLANE_HADOLINT scripts/install-hadolint.sh -x hadolint "Dockerfile lint"
install_tool PDPLANE_PYZMQ_PYTHON scripts/install-pyzmq.sh -x pyzmq "the sims' libzmq interop"
install_tool PDPLANE_VLLM_PYTHON scripts/install-vllm.sh -x "vLLM's CPU build" "the real-engine suite, in .venv-vllm"

if [ -z "${PDPLANE_SMG:-}" ] || [ -z "${PDPLANE_VLLM_ROUTER:-}" ]; then
  step "installing SMG and vllm-router into .venv (interop tests)"
  if paths=$(scripts/install-routers.sh | tail -n 2); then
    while IFS= read -r kv; do export "$kv"; done <<<"$paths"
    echo "$paths"
  elif [ "${CI:-}" = true ]; then
    echo "SMG and vllm-router could not be installed; under CI=true the interop tests are required" >&2
    exit 1
  fi
fi

if [ -z "${PDPLANE_CHROMIUM:-}" ]; then
  for c in chromium chromium-browser google-chrome; do
    if command -v "$c" >/dev/null; then PDPLANE_CHROMIUM=$(command -v "$c"); break; fi
  done
  export PDPLANE_CHROMIUM=${PDPLANE_CHROMIUM:-}
fi

if [ "${CI:-}" = true ]; then
  export PDPLANE_REQUIRE_NIXL=1 PDPLANE_REQUIRE_CHROMIUM=1
fi

step "registry store contract suite, on both stores"
go test -race -count=1 -v -run 'TestContract' ./registry/registrytest |
  grep -E -- '--- (PASS|FAIL|SKIP): TestContract/(memstore|pgstore) ' || true

step "go test -race ./... (all but ./realengine)"
go test -race -count=1 -timeout 12m $(go list ./... | grep -v '/realengine$')

step "the router's tests again, served by net/http alone (serve --front=false)"
PDPLANE_ROUTER_FRONT=false go test -race -count=1 ./router/

step "the real-engine suite: pdplane in front of a real vLLM prefill/decode pair (./realengine)"
go test -count=1 -timeout 30m -v ./realengine/

step "property-based fuzzing of the API against openapi.yaml (schemathesis)"
scripts/fuzz-api.sh
