// Package pdproto holds the engines' wire formats that the router and the
// simulator share: SSE framing, and the failure formats of SGLang and vLLM
// with one classification of them.
//
// The router reads engine answers through it (to recognise a failure, on
// whichever leg and in whichever form it comes); the simulator writes its
// failures through it (to produce them the way the real engines do). Each
// format is written once, here, from the engines' sources, which the tests
// cite:
//
//   - SGLang, a request aborted by its scheduler (prepare_abort with a
//     status): non-streamed, HTTP status and a flat ErrorResponse body;
//     OpenAI routes streamed, HTTP 200 then `data: {"error": {...}}`;
//     /generate streamed, HTTP 200 then an ordinary event whose
//     meta_info.finish_reason is {"type": "abort", "message", "status_code"}.
//   - vLLM, an OpenAI error: non-streamed, HTTP status and
//     {"error": {"message", "type", "param", "code"}}; streamed, HTTP 200 then
//     `data: {"error": {...}}`. A KV load that failed under
//     kv_load_failure_policy=fail is "Internal server error" (500).
//
// Classify decides what a failure means for routing: SGLang's "Missing NIXL
// destination KV memory kind" is the stale rule; other KV transfer failures
// are failures of the pair; overload is neither; a refusal is the client's.
//
// The package owns formats and their meaning only. It does no I/O, keeps no
// state, and must not decide what to do about a failure (breakers, stale
// marks, retries): the router does.
package pdproto
