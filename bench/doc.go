// Package bench measures pdplane's router side by side with the routers
// users run today, SMG (PyPI `smg`) and vllm-router (PyPI `vllm-router`),
// black-box: every party is a separate process on 127.0.0.1.
//
// Compare starts `pdplane sim` prefill and decode engines once per engine
// kind (SGLang engines for SMG, vLLM engines for vllm-router), registers them
// with a `pdplane serve` and puts the peer router in front of the same
// engines, then drives the same load through pdplane and the peer in
// alternating windows. The engines share the routers' machine, so they run
// as cheaply as the PD protocol allows: --cheap-transfer (one page moved a
// request, no KV computed) with 1 KiB pages. Held streams are measured on a second set of engines
// whose decode generates a token a second (Config.HeldTokenTime), with
// fresh routers in front:
// at each level (Config.HeldStreams, in increasing order, through the same
// routers) the harness holds that many streams open, reads each router's
// memory and descriptors, and sends a short probe of new streamed requests
// through it while the streams stay held, for their time to first token.
// It raises its own open-files limit to the hard limit first, so that the
// processes it starts inherit it (RaiseFDLimit).
// The load generator runs in the calling process. The router processes
// (each with its children) are measured: CPU from /proc/<pid>/stat divided
// by the requests served, resident memory and open file descriptors per
// held stream, client-side time to first byte; beside them, the CPU of the
// engines behind each router per request, which shares the machine.
//
// Routing (`pdplane bench routing`) measures what routers pick rather than
// what they cost: a seeded workload (GenerateWorkload: multi-turn
// conversations over shared system prompts, or fresh prompts of the same
// lengths) sent at a Poisson rate through each router, each in front of a
// fleet of its own started cold, whose prefill sims keep a prefix cache and
// compute only the tokens they do not find in it. The prefills' counters
// give the cache hit rate; the client gives TTFT. Beside pdplane's policies
// and the peers runs an oracle (routing_oracle.go), the harness's own
// router that asks every prefill for its cache and queue before each pick.
//
// The package also owns the command lines those processes are started with
// (Process, SimArgs, SMGArgs, VLLMRouterArgs), which the interop tests share.
// It imports no other pdplane package: it knows pdplane only as a binary.
package bench
