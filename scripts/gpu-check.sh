#!/usr/bin/env bash
# Runs the VRAM pair preflight where a CUDA device is present and prints its
# GB/s: two NIXL agents in one process, each with a VRAM probe region on
# device 0 (allocated through the CUDA runtime, loaded with purego), WRITE a
# pattern with a notification, READ it back, compare, 4 KiB to 64 MiB.
#   scripts/gpu-check.sh
# Needs libnixl_capi.so (scripts/install-nixl.sh, or PDPLANE_NIXL_LIB) and
# libcudart.so (on the loader path, or PDPLANE_CUDART_LIB). Without a CUDA
# runtime or device it says so and exits 0; PDPLANE_REQUIRE_CUDA=1 makes
# that a failure. PDPLANE_GPU_UCX_TLS restricts UCX's transports (default:
# UCX picks, e.g. cuda_copy,cuda_ipc on one host).
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(go test -count=1 -run '^TestVRAMPreflight$' -v ./transfer/cuda/ 2>&1) || { echo "$out"; exit 1; }
if grep -q -- '--- SKIP: TestVRAMPreflight' <<<"$out"; then
  echo "gpu-check: skipped, no VRAM preflight on this machine:"
  grep -o 'VRAM preflight skipped: .*\|NIXL not available.*' <<<"$out" | head -1
  exit 0
fi
grep -o 'VRAM preflight 4 KiB.*' <<<"$out"
echo "gpu-check: VRAM preflight passed"
