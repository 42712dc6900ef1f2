#!/usr/bin/env bash
# nixl-runtime-libs.sh: copy out of an installed nixl-cu12 wheel only what
# pdplane loads at run time: libnixl_capi.so, the UCX backend plugin
# (plugins/libplugin_UCX.so), UCX's transport modules (nixl_cu12.libs/ucx),
# and every library of the wheel these need (by ldd). The wheel's layout is
# kept (.nixl_cu12.mesonpy.libs beside nixl_cu12.libs) because the
# libraries' RPATHs ($ORIGIN/../nixl_cu12.libs) point at each other. Left
# out: the other NIXL plugins (object stores, GDS, ...) and the libraries
# only they need (AWS, Azure SDKs), UCX's perftest modules, NIXL's Python
# bindings. Libraries the system or the GPU driver provides (libcuda,
# libssl, libstdc++) are not copied.
#
#   scripts/nixl-runtime-libs.sh SITE_PACKAGES DEST
#
# DEST/.nixl_cu12.mesonpy.libs/libnixl_capi.so is then PDPLANE_NIXL_LIB and
# DEST/.nixl_cu12.mesonpy.libs/plugins is NIXL_PLUGIN_DIR. Used by the
# Dockerfile's nixl stage; transfer/nixl's tests run NIXL from its output.
set -euo pipefail

if [ $# -ne 2 ]; then
	echo "usage: $0 SITE_PACKAGES DEST" >&2
	exit 2
fi
site=$(realpath "$1")
dest=$2
libs=.nixl_cu12.mesonpy.libs

roots=("$site/$libs/libnixl_capi.so" "$site/$libs/plugins/libplugin_UCX.so")
for f in "$site"/nixl_cu12.libs/ucx/lib*.so*; do
	case $f in
	*perftest*) ;;
	*) roots+=("$f") ;;
	esac
done
for f in "${roots[@]:0:2}"; do
	if [ ! -f "$f" ]; then
		echo "nixl-runtime-libs: $f is missing: is nixl-cu12 installed in $site?" >&2
		exit 1
	fi
done

# The roots and the wheel's libraries they load, as paths relative to site.
{
	for f in "${roots[@]}"; do
		realpath "$f"
		# "libfoo.so => /path/libfoo.so (0x...)"; "not found" is the
		# system's or the driver's to provide.
		ldd "$f" | while read -r _ arrow dep _; do
			if [ "$arrow" = "=>" ] && [ "${dep#/}" != "$dep" ]; then
				realpath "$dep"
			fi
		done
	done
} | sort -u | while read -r f; do
	case $f in
	"$site"/*) echo "${f#"$site"/}" ;;
	esac
done >"${TMPDIR:-/tmp}/nixl-runtime-libs.$$"

mkdir -p "$dest"
while read -r rel; do
	mkdir -p "$dest/$(dirname "$rel")"
	cp -p "$site/$rel" "$dest/$rel"
done <"${TMPDIR:-/tmp}/nixl-runtime-libs.$$"
n=$(wc -l <"${TMPDIR:-/tmp}/nixl-runtime-libs.$$")
rm -f "${TMPDIR:-/tmp}/nixl-runtime-libs.$$"
echo "nixl-runtime-libs: copied $n files into $dest ($(du -sh "$dest" | cut -f1))" >&2
