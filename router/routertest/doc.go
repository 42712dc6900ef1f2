// Package routertest holds what tests of the router need: fake engines that
// speak SGLang's and vLLM's PD protocols over real HTTP (FakeSGLang,
// FakeVLLM) and can be told to fail, stall, or stream chunks with pauses;
// and specs of peers that pair with each other (Spec, ReadyPeer). Stale
// marks and quarantines are the registry's to decide: router tests report
// to a real store.
//
// The fakes check what a real engine would refuse (a missing or
// mis-sized bootstrap triple, a vLLM prefill without kv_transfer_params) and
// answer 400, so a router that breaks the protocol fails its tests.
//
// The simulator (sim, sim/simtest) is the engine double router tests use;
// these fakes remain only for two router tests that need an answer the
// simulator does not give: a streamed decode's headers sent before its KV
// arrives, and a successful answer quoting an engine error. Do not add new
// users.
package routertest
