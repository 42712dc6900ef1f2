// Package interop holds black-box tests of pdplane next to the routers users
// run today: SMG (PyPI `smg`) and vllm-router (PyPI `vllm-router`).
//
// The simulated engines (`pdplane sim`) must satisfy those routers' health
// checks and PD protocols unchanged, and pdplane itself must serve as a
// regular worker behind SMG. Every test runs the real binaries as separate
// processes on 127.0.0.1: the pdplane binary built once by TestMain, and the
// routers from the paths in PDPLANE_SMG and PDPLANE_VLLM_ROUTER, which
// `make test` installs into .venv (scripts/install-routers.sh). Outside CI a
// missing router skips its test; under CI=true it fails.
package interop
