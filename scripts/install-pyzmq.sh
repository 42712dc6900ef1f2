#!/usr/bin/env bash
# install-pyzmq.sh: install pyzmq (Python's binding of libzmq, the ZeroMQ
# library SGLang's KV managers speak through) into .venv at the repository
# root and print the absolute path of the venv's python as the last line of
# stdout. Idempotent. The sim's libzmq interop tests (sim/libzmq_test.go)
# run it as the decode's PUSH and the prefill's PULL.
#
#   export PDPLANE_PYZMQ_PYTHON=$(scripts/install-pyzmq.sh | tail -1)
#
# Environment:
#   PDPLANE_VENV    venv folder (default: <repo>/.venv, shared with NIXL)
#   PYZMQ_VERSION   pyzmq version (default: 27.1.0)
#   PYTHON          python used to create the venv (default: python3)
set -euo pipefail

# shellcheck source=venv.sh
. "$(dirname "${BASH_SOURCE[0]}")/venv.sh" install-pyzmq

ensure_venv
pip_install_pinned "pyzmq==${PYZMQ_VERSION:-27.1.0}"
"$venv/bin/python" -c 'import zmq; print("pyzmq", zmq.__version__, "libzmq", zmq.zmq_version())' >&2
echo "$venv/bin/python"
