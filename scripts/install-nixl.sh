#!/usr/bin/env bash
# install-nixl.sh: install NIXL's C API (libnixl_capi.so, shipped in the
# nixl-cu12 wheel together with libnixl.so, UCX and the backend plugins) into
# .venv at the repository root, and print the absolute path of
# libnixl_capi.so as the last line of stdout. Idempotent: a second run
# installs nothing and prints the same path.
#
#   scripts/install-nixl.sh
#
# pdplane then finds the library by itself when run from the repository
# root (or as ./pdplane or bin/pdplane of it): it searches .venv in the
# working directory and beside the executable, and $PDPLANE_VENV. From
# elsewhere, or to pin one copy, export its path:
#
#   export PDPLANE_NIXL_LIB=$(scripts/install-nixl.sh | tail -1)
#
# Environment:
#   PDPLANE_VENV     venv folder (default: <repo>/.venv)
#   NIXL_VERSION     nixl-cu12 version (default: 1.5.1)
#   PYTHON           python used to create the venv (default: python3)
#   NIXL_PIP_DEPS=1  also install the wheel's declared dependencies (torch);
#                    by default only numpy is added, which is all the C
#                    library and NIXL's Python API (nixl_cu12._api) need.
#
# The C library does not depend on the Python version: when no wheel fits
# the local Python, the cp312 wheel is downloaded and unpacked instead.
set -euo pipefail

# shellcheck source=venv.sh
. "$(dirname "${BASH_SOURCE[0]}")/venv.sh" install-nixl
version="${NIXL_VERSION:-1.5.1}"
pkg="nixl-cu12==$version"

find_lib() {
	find "$venv" \( -name 'libnixl_capi.so' -o -name 'libnixl_capi.so.*' \) -print 2>/dev/null | sort | head -1
}

ensure_venv
installed="$(pip_version nixl-cu12)"
if [ "$installed" != "$version" ] && [ ! -f "$venv/.nixl-wheel-$version" ]; then
	log "installing $pkg into $venv"
	deps=(--no-deps)
	if [ "${NIXL_PIP_DEPS:-0}" = 1 ]; then
		deps=()
	fi
	if ! "$venv/bin/python" -m pip install --disable-pip-version-check -q "${deps[@]}" "$pkg" numpy >&2; then
		# No wheel for this Python: unpack the cp312 one; the shared
		# libraries inside work with any interpreter (or none).
		log "no $pkg wheel for $("$venv/bin/python" -V 2>&1); unpacking the cp312 wheel"
		whl="$root/.whl"
		mkdir -p "$whl"
		"$venv/bin/python" -m pip download --disable-pip-version-check -q --no-deps \
			--only-binary=:all: --python-version 3.12 -d "$whl" "$pkg" >&2
		dest="$venv/nixl-wheel"
		rm -rf "$dest"
		mkdir -p "$dest"
		"$venv/bin/python" -m zipfile -e "$(ls "$whl"/nixl_cu12-"$version"-*.whl | head -1)" "$dest" >&2
		touch "$venv/.nixl-wheel-$version"
	fi
fi

lib="$(find_lib)"
if [ -z "$lib" ]; then
	log "libnixl_capi.so not found under $venv after installing $pkg"
	exit 1
fi
plugins="$(dirname "$lib")/plugins"
if [ ! -f "$plugins/libplugin_UCX.so" ]; then
	log "warning: libplugin_UCX.so is not in $plugins; set NIXL_PLUGIN_DIR to the folder holding it:"
	find "$venv" -name 'libplugin_UCX.so' -print >&2 || true
fi
echo "$lib"
