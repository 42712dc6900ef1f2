# venv.sh: sourced by the install-*.sh scripts, which share one Python venv
# at the repository root. After `. venv.sh NAME` (NAME prefixes the log):
#   root, venv, python  the repository root, the venv ($PDPLANE_VENV, default
#                       <root>/.venv) and the python that creates it
#                       ($PYTHON, default python3)
#   log MSG...          writes "NAME: MSG" to stderr (stdout is the result)
#   ensure_venv         creates $venv unless it has a python already
#   pip_version PKG     prints the version of PKG installed in $venv, if any
#   pip_install_pinned NAME==VERSION...
#                       installs, in one pip run, those not installed at that
#                       version
# shellcheck shell=bash

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${PDPLANE_VENV:-$root/.venv}"
python="${PYTHON:-python3}"
venv_log_name=$1

log() { echo "$venv_log_name: $*" >&2; }

ensure_venv() {
	if [ ! -x "$venv/bin/python" ]; then
		log "creating $venv"
		"$python" -m venv "$venv" >&2
	fi
}

pip_version() {
	"$venv/bin/python" -m pip show "$1" 2>/dev/null | sed -n 's/^Version: //p' || true
}

pip_install_pinned() {
	local spec missing=()
	for spec in "$@"; do
		[ "$(pip_version "${spec%%==*}")" = "${spec##*==}" ] || missing+=("$spec")
	done
	if [ ${#missing[@]} -gt 0 ]; then
		log "installing ${missing[*]} into $venv"
		"$venv/bin/python" -m pip install --disable-pip-version-check -q "${missing[@]}" >&2
	fi
}
