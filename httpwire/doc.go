// Package httpwire is the router's HTTP/1.1 plumbing, written to cost less
// CPU and memory per request and per held stream than net/http's server and
// client (router/BENCHMARKS.md: 4-12 % of the router's CPU a request, 59 %
// of a held stream's memory). It holds no routing: the router tells it
// what to send and what to write, and it knows nothing of engines.
//
// What it holds:
//
//   - Listener wraps the server's listener. With Front it reads connections
//     itself and serves the router's hot requests (a POST of HTTP/1.1 to a
//     generation route, a GET of the model list) through the server's
//     whole handler with a ResponseWriter of its own, judging every request
//     head more strictly than net/http where RFC 9112 lets a server refuse
//     (front.go); anything else goes to net/http with the bytes already
//     read. It also takes back the connections of streams taken over, for
//     the client's next request.
//   - TakeOver takes a slow stream's connection off net/http (stream.go):
//     the rest of the chunked answer is the Stream's, net/http's goroutine,
//     reader and buffers are released for the stream's life, and what
//     net/http did for the stream the Stream keeps doing. A client that
//     closes its connection cancels the request: one goroutine (Watcher,
//     Linux's epoll) watches every taken-over connection, as net/http's
//     background read did one each. The answer ends with the chunked
//     terminator (RFC 9112 §7.1), and the connection goes back to the
//     server for the client's next request (keep-alive): the Watcher waits
//     for its first bytes, up to the listener's idle timeout, and hands the
//     connection to the Listener. A shutdown cuts what is left (Streams).
//   - Transport is the client for engine legs (client.go): no goroutine per
//     connection, head and body in one writev, answers parsed strictly to
//     RFC 9112 on the caller's goroutine, and a body that can wait for the
//     engine's next bytes without holding a read buffer (Await).
//   - Hooks, OnDone and HookTarget: contexts that keep the hooks to run at
//     their end in a small array (ctx.go), so that a held stream does not
//     keep a map of children, and a goroutine, per leg.
//
// Its conformance tests are beside it: the client's against RFC 9112
// (upstream_conformance_test.go), the front's strictness against the RFC's
// text (front_strict_test.go).
package httpwire
