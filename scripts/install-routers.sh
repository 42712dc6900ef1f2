#!/usr/bin/env bash
# install-routers.sh: install the routers users run today, SMG (PyPI `smg`)
# and vllm-router (PyPI `vllm-router`), into .venv at the repository root,
# for the interop tests (./interop). Idempotent. Prints two lines,
# PDPLANE_SMG=<path> and PDPLANE_VLLM_ROUTER=<path>, for `export`.
#
#   eval "export $(scripts/install-routers.sh | tail -2 | tr '\n' ' ')"
#
# Environment:
#   PDPLANE_VENV         venv folder (default: <repo>/.venv)
#   SMG_VERSION          smg version (default: 1.13.0)
#   VLLM_ROUTER_VERSION  vllm-router version (default: 0.1.17)
#   PYTHON               python used to create the venv (default: python3)
set -euo pipefail

# shellcheck source=venv.sh
. "$(dirname "${BASH_SOURCE[0]}")/venv.sh" install-routers
want=("smg==${SMG_VERSION:-1.13.0}" "vllm-router==${VLLM_ROUTER_VERSION:-0.1.17}")

ensure_venv
pip_install_pinned "${want[@]}"

for bin in smg vllm-router; do
	if [ ! -x "$venv/bin/$bin" ]; then
		log "$venv/bin/$bin is missing after installing ${want[*]}"
		exit 1
	fi
done
echo "PDPLANE_SMG=$venv/bin/smg"
echo "PDPLANE_VLLM_ROUTER=$venv/bin/vllm-router"
