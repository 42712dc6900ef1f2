// Package router is pdplane's data plane: an OpenAI-compatible front door
// that splits each request into a prefill leg and a decode leg on a
// compatible, ready pair of engines and streams the decode's answer back.
//
// It owns:
//
//   - pair selection over the immutable replica.Snapshot it is handed, with
//     a policy per role (round_robin, random, power_of_two, cache_aware) that
//     costs O(1) or O(log n) in the number of peers and no I/O;
//   - the engine protocols: SGLang's bootstrap triple (both legs POSTed the
//     same body concurrently) and vLLM's NixlConnector kv_transfer_params
//     (prefill first, then decode with the prefill's parameters);
//   - the SSE relay, retries on another pair before the first byte reaches
//     the client, per-peer and per-pair circuit breakers, a deadline for a
//     streamed decode's first byte after a good prefill, and what to do
//     about each upstream failure. Recognising the failure (a status body,
//     an OpenAI error event, a /generate abort event, on either leg) is
//     pdproto's; the router acts on its class: SGLang's "Missing NIXL
//     destination KV memory kind" opens that pair's breaker at once (the
//     retry takes the decode with another prefill) and is reported to the
//     registry, whose rule marks the decode stale (or quarantines a pair
//     that fails that way again after the decode re-registered); other
//     transfer failures and vLLM's NIXL failures count against the pair;
//   - the client's side of a slow stream: one whose decode stays silent
//     for 100 ms leaves net/http's connection (takeover.go), so that a
//     held stream costs the router ~20 KiB instead of ~45; serve the
//     router's server on an httpwire.Listener to keep such connections
//     alive after their stream (with its Front, httpwire reads plain
//     HTTP/1.1 generation requests without net/http's server).
//
// With Config.TracerProvider set it traces each routed request: a server
// span (continuing the client's W3C traceparent), a span per attempt on a
// pair (a retry says which failure it follows), and a span per leg whose
// trace context is sent to the engine in traceparent and tracestate, so
// that SGLang's and vLLM's own spans join the trace. The request log line
// carries the trace_id. Without a provider no span is made.
//
// It must not touch a database or the store beyond PeerReporter (a failed
// transfer), TrialReporter (a pair on trial that transferred) and
// ExchangeReporter (the pairs it served, every second). Its state
// lives in a Router built by New, except what every Router of a process
// shares on purpose: buffer pools and the pool of spare goroutines that run
// streams beside their handlers (workers.go). Request bodies are never fully unmarshalled: the
// router validates the JSON, reads the few top-level fields it needs, and
// splices its own fields into the original bytes.
//
// Its tests run over sim, the one engine double of each engine kind.
package router
