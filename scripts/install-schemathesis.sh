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

# shellcheck source=venv.sh
. "$(dirname "${BASH_SOURCE[0]}")/venv.sh" install-schemathesis

ensure_venv
pip_install_pinned "schemathesis==${SCHEMATHESIS_VERSION:-4.32.5}"
echo "$venv/bin/st"
