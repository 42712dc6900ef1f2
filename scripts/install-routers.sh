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

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${PDPLANE_VENV:-$root/.venv}"
python="${PYTHON:-python3}"
want=("smg==${SMG_VERSION:-1.13.0}" "vllm-router==${VLLM_ROUTER_VERSION:-0.1.17}")

log() { echo "install-routers: $*" >&2; }

if [ ! -x "$venv/bin/python" ]; then
	log "creating $venv"
	"$python" -m venv "$venv" >&2
fi

missing=()
for spec in "${want[@]}"; do
	name=${spec%%==*} version=${spec##*==}
	have="$("$venv/bin/python" -m pip show "$name" 2>/dev/null | sed -n 's/^Version: //p' || true)"
	[ "$have" = "$version" ] || missing+=("$spec")
done
if [ ${#missing[@]} -gt 0 ]; then
	log "installing ${missing[*]} into $venv"
	"$venv/bin/python" -m pip install --disable-pip-version-check -q "${missing[@]}" >&2
fi

for bin in smg vllm-router; do
	if [ ! -x "$venv/bin/$bin" ]; then
		log "$venv/bin/$bin is missing after installing ${want[*]}"
		exit 1
	fi
done
echo "PDPLANE_SMG=$venv/bin/smg"
echo "PDPLANE_VLLM_ROUTER=$venv/bin/vllm-router"
