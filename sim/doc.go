// Package sim is pdplane's engine simulator: a prefill or decode engine that
// speaks the HTTP protocols the router speaks to real SGLang and vLLM
// engines, keeps a real KV pool in host memory off the Go heap, and moves
// real bytes between engines through a transfer backend (transfer/tcp by
// default, transfer/nixl when libnixl_capi.so is available). Tests, demos
// and benchmarks run PD fleets with it and no GPU.
//
// A Sim serves:
//
//   - the generation endpoints POST /v1/chat/completions and
//     /v1/completions (and, for SGLang, POST /generate), streamed (SSE, one
//     event flushed per token) or not;
//   - GET /health and /v1/models; for SGLang /health_generate,
//     /get_model_info, /server_info, the load endpoints /v1/loads and
//     /get_load, and the scheduler gauges of GET /metrics; for vLLM the
//     load gauges and counters of GET /metrics (load_api.go);
//   - the tokenize endpoints a router asks for a request's tokens: vLLM's
//     POST /tokenize, SGLang's POST /v1/tokenize and /tokenize
//     (tokenize_api.go);
//   - POST/GET /_sim/fault, GET /_sim/stats and POST /_sim/cache_probe,
//     the simulator's own controls.
//
// An SGLang prefill serves SGLang's bootstrap server on its bootstrap port
// (PUT/GET /route, POST /register_dp_rank and /query_dp_ranks, GET
// /health) and, like every SGLang engine, binds a ZeroMQ rank socket: SGLang
// decodes fetch the prefill's rank from the bootstrap server and send it
// their KV args and each request's destination pages in SGLang's multipart
// frames; the KV comes back with SGLang's notification tags
// (sglang_wire.go). A vLLM prefill serves a side channel there instead,
// sim-internal, modelled on vLLM's NIXL side channel (decodes fetch the
// prefill's agent metadata).
//
// The KV a prefill computes is a pure function of the prompt's tokens, the
// region and the position; a decode verifies every byte it received before
// it generates, so a transfer that moved the wrong bytes is an error answer,
// never a silent success. Generated text is deterministic too. For load
// tests, Config.CheapTransfer keeps the protocol (bootstrap, the transfer
// and its notification, the per-token times) but computes and verifies no KV
// and moves one page per request, and Config.Pages sizes the pool for the
// requests held at once.
//
// A prefill keeps a model of its prefix cache (prefix_cache.go): the full
// blocks of the prompts it computed, keyed by chained hashes of their
// tokens, least recently used first out. A prompt's prefill time covers
// only the tokens the cache did not hold, its hits are counted in the
// engines' own metrics, and, with Config.KVEventsAddr, the cache's changes
// go out as KV events on vLLM's ZeroMQ wire, replay included
// (kv_events.go), in both engine modes. The model decides times, counters
// and events only: the KV bytes of every request are still computed into
// pages of its own, and its pages freed when it is done. With
// Config.PrefillSlots, prompts wait their turn to compute
// (compute_queue.go), as a real engine's do under load, and count as
// queued meanwhile.
//
// *Sim implements agent.Engine: Spec describes it for registration,
// Reregister gives it a fresh transfer agent (new name, memory registered
// again, new metadata); Load is the work its load endpoints publish, which
// the agent's probes read over HTTP as they read a real engine's. Faults (see Fault) make it
// misbehave on purpose, including SGLang's "Missing NIXL destination KV
// memory kind", reproduced by the mechanism that causes it in a real fleet.
//
// The package owns only the simulator. It never reaches into the control
// plane or the router; devfleet wires a Sim to an agent (SetPeerID from OnRegistered;
// OnTransferError through agent.PeerOfAgent and agent.ReportFor to
// agent.ReportTransferFailure), and the agent talks to the control plane.
package sim
