#!/usr/bin/env bash
# install-schemathesis.sh: install schemathesis (the property-based API
# fuzzer that scripts/fuzz-api.sh runs over openapi.yaml) into .venv at the
# repository root, and print the absolute path of its `st` command as the
# last line of stdout. Idempotent: a second run installs nothing.
#
# Environment:
#   PDPLANE_VENV         venv folder (default: <repo>/.venv, shared with NIXL)
#   SCHEMATHESIS_VERSION schemathesis version (default: 4.32.5; its `st run`
#                        flags are what fuzz-api.sh passes, 4.x changed them)
#   PYTHON               python used to create the venv (default: python3)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${PDPLANE_VENV:-$root/.venv}"
version="${SCHEMATHESIS_VERSION:-4.32.5}"
python="${PYTHON:-python3}"

log() { echo "install-schemathesis: $*" >&2; }

if [ ! -x "$venv/bin/python" ]; then
	log "creating $venv"
	"$python" -m venv "$venv" >&2
fi
installed="$("$venv/bin/python" -m pip show schemathesis 2>/dev/null | sed -n 's/^Version: //p' || true)"
if [ "$installed" != "$version" ]; then
	log "installing schemathesis==$version into $venv"
	"$venv/bin/python" -m pip install --disable-pip-version-check -q "schemathesis==$version" >&2
fi
echo "$venv/bin/st"
