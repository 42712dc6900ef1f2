package httpwire

// An HTTP/1.1 conformance suite for Transport, the router's own
// client for engine legs. Each case runs the client against a raw TCP server
// that writes exact response bytes, so the case controls the wire; it names
// what it checks and the section of RFC 9112 (message syntax and framing) or
// RFC 9110 (semantics) that says so.

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// wireServer accepts connections and hands each to serve with its index
// (0 for the first connection accepted).
type wireServer struct {
	url   string
	conns atomic.Int64
}

// wireConn is one server side connection.
type wireConn struct {
	net.Conn
	br *bufio.Reader
}

// readRequest reads one request, body included; it returns the body.
func (c *wireConn) readRequest() (string, error) {
	req, err := http.ReadRequest(c.br)
	if err != nil {
		return "", err
	}
	b, err := io.ReadAll(req.Body)
	return string(b), err
}

func (c *wireConn) write(s string) { _, _ = io.WriteString(c, s) }

// eachRequest reads requests until the client goes, handing answer each
// request's index on this connection (0 for the first) and its body; answer
// returns false to stop serving the connection.
func (c *wireConn) eachRequest(answer func(i int, body string) bool) {
	for i := 0; ; i++ {
		body, err := c.readRequest()
		if err != nil || !answer(i, body) {
			return
		}
	}
}

// reset closes the connection with a TCP RST instead of a FIN.
func (c *wireConn) reset() {
	if tc, ok := c.Conn.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	c.Close()
}

func newWireServer(t *testing.T, serve func(c *wireConn, idx int)) *wireServer {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &wireServer{url: "http://" + l.Addr().String()}
	var (
		mu    sync.Mutex
		open  []net.Conn
		wg    sync.WaitGroup
		accWG sync.WaitGroup
	)
	accWG.Add(1)
	go func() {
		defer accWG.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			idx := int(s.conns.Add(1) - 1)
			mu.Lock()
			open = append(open, c)
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				serve(&wireConn{Conn: c, br: bufio.NewReader(c)}, idx)
			}()
		}
	}()
	t.Cleanup(func() {
		l.Close()
		accWG.Wait()
		mu.Lock()
		for _, c := range open {
			c.Close() // wakes a handler blocked on the client
		}
		mu.Unlock()
		wg.Wait()
	})
	return s
}

// send makes one request with a watchdog: a client that waits for bytes
// that never come fails the case instead of hanging the suite.
func send(t *testing.T, tr *Transport, method, url, body string) (*http.Response, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	req, err := http.NewRequestWithContext(ctx, method, url, NewRequestBody([]byte(body)))
	if err != nil {
		t.Fatal(err)
	}
	return tr.RoundTrip(req)
}

// wireTransport is a test transport whose idle connections close with the
// test.
func wireTransport(t *testing.T) *Transport {
	t.Helper()
	tr := newTestTransport()
	t.Cleanup(tr.CloseIdleConnections)
	return tr
}

// mustPost sends a POST that must succeed and returns its body read to the end.
func mustPost(t *testing.T, tr *Transport, url, body string) string {
	t.Helper()
	resp, err := send(t, tr, http.MethodPost, url, body)
	if err != nil {
		t.Fatal(err)
	}
	return readAll(t, resp)
}

const nextAnswer = "HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nnext"

// A framing case: the first request on the first connection gets wire;
// every other request gets nextAnswer. A second request then shows whether
// the first connection went back to the pool.
type framingCase struct {
	name   string
	rfc    string // the section that requires the behaviour
	method string // POST unless set
	wire   string
	close  bool // the server closes the connection after wire

	status  int    // the final status, when the round trip succeeds
	body    string // the body read to its end
	trailer string // X-Checksum trailer expected after the body
	rtErr   bool   // the round trip fails
	bodyErr error  // reading the body fails with this (nil: any error when set by badBody)
	badBody bool   // reading the body fails
	reused  bool   // the second request reuses the connection
}

func runFramingCase(t *testing.T, tc framingCase) {
	t.Helper()
	srv := newWireServer(t, func(c *wireConn, idx int) {
		c.eachRequest(func(i int, _ string) bool {
			if idx == 0 && i == 0 {
				c.write(tc.wire)
				return !tc.close
			}
			c.write(nextAnswer)
			return true
		})
	})
	tr := wireTransport(t)
	method := tc.method
	if method == "" {
		method = http.MethodPost
	}
	resp, err := send(t, tr, method, srv.url+"/v1/completions", "x")
	switch {
	case tc.rtErr && err == nil:
		resp.Body.Close()
		t.Fatalf("%s: round trip succeeded with %d, want an error", tc.rfc, resp.StatusCode)
	case tc.rtErr:
		if errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("%s: the client waited for bytes that never came: %v", tc.rfc, err)
		}
	case err != nil:
		t.Fatalf("%s: round trip: %v", tc.rfc, err)
	default:
		if resp.StatusCode != tc.status {
			t.Fatalf("%s: status %d, want %d", tc.rfc, resp.StatusCode, tc.status)
		}
		b, rerr := io.ReadAll(resp.Body)
		resp.Body.Close()
		switch {
		case tc.badBody && rerr == nil:
			t.Fatalf("%s: body %q read without error, want a failed read", tc.rfc, b)
		case tc.badBody && errors.Is(rerr, io.EOF):
			t.Fatalf("%s: body error %v reads as a clean end", tc.rfc, rerr)
		case tc.badBody && errors.Is(rerr, context.DeadlineExceeded):
			t.Fatalf("%s: the client waited for bytes that never came: %v", tc.rfc, rerr)
		case tc.badBody && tc.bodyErr != nil && !errors.Is(rerr, tc.bodyErr):
			t.Fatalf("%s: body error %v, want %v", tc.rfc, rerr, tc.bodyErr)
		case !tc.badBody && rerr != nil:
			t.Fatalf("%s: body: %v", tc.rfc, rerr)
		case !tc.badBody && string(b) != tc.body:
			t.Fatalf("%s: body %q, want %q", tc.rfc, b, tc.body)
		}
		if got := resp.Trailer.Get("X-Checksum"); got != tc.trailer {
			t.Fatalf("%s: trailer X-Checksum %q, want %q", tc.rfc, got, tc.trailer)
		}
	}

	if got := mustPost(t, tr, srv.url+"/v1/completions", "y"); got != "next" {
		t.Fatalf("second request: body %q: the first answer's bytes leaked into it", got)
	}
	want := int64(2)
	if tc.reused {
		want = 1
	}
	if n := srv.conns.Load(); n != want {
		t.Fatalf("%s: %d connections for two requests, want %d (reuse=%v)", tc.rfc, n, want, tc.reused)
	}
}

const chunkedHead = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"

var framingCases = []framingCase{
	// Content-Length.
	{name: "ContentLength", rfc: "RFC 9112 §6.3(6)", wire: "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello",
		status: 200, body: "hello", reused: true},
	{name: "ContentLengthZero", rfc: "RFC 9112 §6.3(6)", wire: "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
		status: 200, reused: true},
	{name: "ContentLengthRepeatedSameValue", rfc: "RFC 9110 §8.6", wire: "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\nhello",
		status: 200, body: "hello", reused: true},
	{name: "ContentLengthNameCaseAndWhitespace", rfc: "RFC 9112 §5.1, RFC 9110 §5.1", wire: "HTTP/1.1 200 OK\r\ncontent-LENGTH:   5  \r\n\r\nhello",
		status: 200, body: "hello", reused: true},
	{name: "ContentLengthDiffering", rfc: "RFC 9112 §6.3(5)", wire: "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!",
		rtErr: true},
	{name: "ContentLengthNotANumber", rfc: "RFC 9112 §6.3(5)", wire: "HTTP/1.1 200 OK\r\nContent-Length: five\r\n\r\nhello",
		rtErr: true},
	{name: "ContentLengthNegative", rfc: "RFC 9112 §6.3(5)", wire: "HTTP/1.1 200 OK\r\nContent-Length: -5\r\n\r\nhello",
		rtErr: true},
	{name: "ContentLengthOverflowing", rfc: "RFC 9112 §6.3(5)", wire: "HTTP/1.1 200 OK\r\nContent-Length: 99999999999999999999\r\n\r\nhello",
		rtErr: true},
	{name: "ContentLengthBeyondBody", rfc: "RFC 9112 §8", wire: "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhello", close: true,
		status: 200, badBody: true, bodyErr: io.ErrUnexpectedEOF},

	// Chunked.
	{name: "ChunkedSeveralChunks", rfc: "RFC 9112 §7.1", wire: chunkedHead + "5\r\nhello\r\n6\r\n world\r\nA\r\n 012345678\r\n0\r\n\r\n",
		status: 200, body: "hello world 012345678", reused: true},
	{name: "ChunkedCodingNameCaseInsensitive", rfc: "RFC 9112 §7", wire: "HTTP/1.1 200 OK\r\nTransfer-Encoding: Chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
		status: 200, body: "hello", reused: true},
	{name: "ChunkedExtensions", rfc: "RFC 9112 §7.1.1", wire: chunkedHead + "5;name=value\r\nhello\r\n6 ; q=\"a;b\"\r\n world\r\n0;last\r\n\r\n",
		status: 200, body: "hello world", reused: true},
	{name: "ChunkedTrailers", rfc: "RFC 9112 §7.1.2", wire: chunkedHead + "5\r\nhello\r\n0\r\nX-Checksum: abc\r\nX-Other: 1\r\n\r\n",
		status: 200, body: "hello", trailer: "abc", reused: true},
	{name: "ChunkedAndContentLength", rfc: "RFC 9112 §6.3(3)", wire: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 100\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
		status: 200, body: "hello"},
	{name: "ContentLengthAndChunked", rfc: "RFC 9112 §6.3(3)", wire: "HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
		status: 200, body: "hello"},
	{name: "TransferCodingUnsupported", rfc: "RFC 9112 §6.1", wire: "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\nhello", close: true,
		rtErr: true},
	{name: "ChunkedNotFinal", rfc: "RFC 9112 §6.3(4)", wire: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, gzip\r\n\r\n5\r\nhello\r\n0\r\n\r\n", close: true,
		rtErr: true},
	{name: "ChunkedTwice", rfc: "RFC 9112 §6.1", wire: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
		rtErr: true},
	{name: "TransferEncodingInHTTP10", rfc: "RFC 9112 §6.1", wire: "HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", close: true,
		rtErr: true},
	{name: "ChunkedCutInData", rfc: "RFC 9112 §8", wire: chunkedHead + "a\r\nhello", close: true,
		status: 200, badBody: true, bodyErr: io.ErrUnexpectedEOF},
	{name: "ChunkedCutBeforeLastChunk", rfc: "RFC 9112 §8", wire: chunkedHead + "5\r\nhello\r\n", close: true,
		status: 200, badBody: true, bodyErr: io.ErrUnexpectedEOF},
	{name: "ChunkedCutInTrailers", rfc: "RFC 9112 §8", wire: chunkedHead + "5\r\nhello\r\n0\r\nX-Checksum: abc\r\n", close: true,
		status: 200, badBody: true, bodyErr: io.ErrUnexpectedEOF},
	{name: "ChunkSizeNotHex", rfc: "RFC 9112 §7.1", wire: chunkedHead + "zz\r\nhello\r\n0\r\n\r\n",
		status: 200, badBody: true},
	{name: "ChunkSizeNegative", rfc: "RFC 9112 §7.1", wire: chunkedHead + "-5\r\nhello\r\n0\r\n\r\n",
		status: 200, badBody: true},
	{name: "ChunkSizeOverflowing", rfc: "RFC 9112 §7.1", wire: chunkedHead + "10000000000000000\r\nhello\r\n0\r\n\r\n",
		status: 200, badBody: true},
	{name: "ChunkSizeOverInt64", rfc: "RFC 9112 §7.1", wire: chunkedHead + "8000000000000000\r\nhello\r\n0\r\n\r\n",
		status: 200, badBody: true},
	{name: "ChunkLineEndless", rfc: "RFC 9112 §7.1.1", wire: chunkedHead + "5;" + strings.Repeat("x", 8<<10) + "\r\nhello\r\n0\r\n\r\n",
		status: 200, badBody: true},
	{name: "ChunkSizeEmpty", rfc: "RFC 9112 §7.1", wire: chunkedHead + "\r\nhello\r\n0\r\n\r\n",
		status: 200, badBody: true},
	{name: "ChunkDataNotFollowedByCRLF", rfc: "RFC 9112 §7.1", wire: chunkedHead + "5\r\nhelloXX0\r\n\r\n",
		status: 200, badBody: true},

	// Delimited by close.
	{name: "CloseDelimitedHTTP10", rfc: "RFC 9112 §6.3(8)", wire: "HTTP/1.0 200 OK\r\n\r\nuntil close", close: true,
		status: 200, body: "until close"},
	{name: "CloseDelimitedConnectionClose", rfc: "RFC 9112 §6.3(8)", wire: "HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nuntil close", close: true,
		status: 200, body: "until close"},
	{name: "CloseDelimitedNoLength", rfc: "RFC 9112 §6.3(8)", wire: "HTTP/1.1 200 OK\r\n\r\nuntil close", close: true,
		status: 200, body: "until close"},
	{name: "ConnectionCloseWithLength", rfc: "RFC 9112 §9.6", wire: "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello",
		status: 200, body: "hello"},
	{name: "ConnectionCloseInList", rfc: "RFC 9112 §9.6", wire: "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: keep-alive, Close\r\n\r\nhello",
		status: 200, body: "hello"},
	{name: "BytesAfterBody", rfc: "RFC 9112 §9.3", wire: "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhelloHTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nstale",
		status: 200, body: "hello"},
	{name: "HTTP10WithLength", rfc: "RFC 9112 §9.3", wire: "HTTP/1.0 200 OK\r\nContent-Length: 5\r\n\r\nhello",
		status: 200, body: "hello"},

	// Interim responses.
	{name: "Interim100Continue", rfc: "RFC 9110 §15.2.1", wire: "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
		status: 200, body: "ok", reused: true},
	{name: "Interim103EarlyHints", rfc: "RFC 8297, RFC 9110 §15.2", wire: "HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
		status: 200, body: "ok", reused: true},
	{name: "InterimSeveral", rfc: "RFC 9110 §15.2", wire: "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 103 Early Hints\r\n\r\n" +
		chunkedHead + "2\r\nok\r\n0\r\n\r\n",
		status: 200, body: "ok", reused: true},
	{name: "Unsolicited101", rfc: "RFC 9110 §7.8", wire: "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n",
		rtErr: true},

	// No body.
	{name: "NoContent204", rfc: "RFC 9112 §6.3(1)", wire: "HTTP/1.1 204 No Content\r\n\r\n",
		status: 204, reused: true},
	{name: "NoContent204IgnoresFraming", rfc: "RFC 9112 §6.3(1)", wire: "HTTP/1.1 204 No Content\r\nTransfer-Encoding: chunked\r\n\r\n",
		status: 204, reused: true},
	{name: "NotModified304WithLength", rfc: "RFC 9112 §6.3(1)", wire: "HTTP/1.1 304 Not Modified\r\nContent-Length: 100\r\n\r\n",
		status: 304, reused: true},
	{name: "HeadWithLength", rfc: "RFC 9112 §6.3(1)", method: http.MethodHead, wire: "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n",
		status: 200, reused: true},
	{name: "HeadChunked", rfc: "RFC 9112 §6.3(1)", method: http.MethodHead, wire: chunkedHead,
		status: 200, reused: true},

	// Heads as the engines' server writes them: captured from uvicorn 0.54.0
	// serving Starlette 1.10.0 responses (SGLang's and vLLM's HTTP stack) —
	// a StreamingResponse(media_type="text/event-stream") and a
	// JSONResponse. Field names are lower case, but for the Transfer-Encoding
	// uvicorn adds itself.
	{name: "UvicornStream", rfc: "RFC 9112 §5, §7.1", wire: "HTTP/1.1 200 OK\r\ndate: Tue, 01 Dec 2026 18:57:51 GMT\r\nserver: uvicorn\r\n" +
		"content-type: text/event-stream; charset=utf-8\r\nTransfer-Encoding: chunked\r\n\r\na\r\ndata: {}\n\n\r\ne\r\ndata: [DONE]\n\n\r\n0\r\n\r\n",
		status: 200, body: "data: {}\n\ndata: [DONE]\n\n", reused: true},
	{name: "UvicornJSON", rfc: "RFC 9112 §5, §6.3(6)", wire: "HTTP/1.1 200 OK\r\ndate: Tue, 01 Dec 2026 18:57:52 GMT\r\nserver: uvicorn\r\n" +
		"content-length: 12\r\ncontent-type: application/json\r\n\r\n{\"text\":\"x\"}",
		status: 200, body: `{"text":"x"}`, reused: true},

	// Heads.
	{name: "HeaderLineWithoutColon", rfc: "RFC 9112 §5", wire: "HTTP/1.1 200 OK\r\nContent-Length 5\r\n\r\nhello",
		rtErr: true},
	{name: "StatusLineHTTP2", rfc: "RFC 9112 §2.3", wire: "HTTP/2.0 200 OK\r\nContent-Length: 5\r\n\r\nhello",
		rtErr: true},
	{name: "StatusLineHTTP09", rfc: "RFC 9112 §2.3", wire: "HTTP/0.9 200 OK\r\nContent-Length: 5\r\n\r\nhello",
		rtErr: true},
	{name: "StatusLineLowercaseName", rfc: "RFC 9112 §2.3", wire: "http/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello",
		rtErr: true},
	{name: "StatusLineNotHTTP", rfc: "RFC 9112 §4", wire: "ICY 200 OK\r\nContent-Length: 5\r\n\r\nhello",
		rtErr: true},
	{name: "StatusCodeTwoDigits", rfc: "RFC 9112 §4", wire: "HTTP/1.1 20 OK\r\nContent-Length: 5\r\n\r\nhello",
		rtErr: true},
	{name: "StatusCodeOutOfRange", rfc: "RFC 9110 §15", wire: "HTTP/1.1 600 Odd\r\nContent-Length: 5\r\n\r\nhello",
		rtErr: true},
	{name: "StatusCodeBelowRange", rfc: "RFC 9110 §15", wire: "HTTP/1.1 099 Odd\r\nContent-Length: 5\r\n\r\nhello",
		rtErr: true},
	{name: "StatusLineWithoutReason", rfc: "RFC 9112 §4", wire: "HTTP/1.1 200 \r\nContent-Length: 2\r\n\r\nok",
		status: 200, body: "ok", reused: true},
	{name: "HeaderLineFolded", rfc: "RFC 9112 §5.2 (a gateway may refuse obs-fold)", wire: "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-A: a\r\n b\r\n\r\nhello",
		rtErr: true},
	{name: "HeaderFirstLineFolded", rfc: "RFC 9112 §5.2", wire: "HTTP/1.1 200 OK\r\n X-A: a\r\nContent-Length: 5\r\n\r\nhello",
		rtErr: true},
	{name: "HeaderNameSpaceBeforeColon", rfc: "RFC 9112 §5.1 (a proxy removes it)", wire: "HTTP/1.1 200 OK\r\nContent-Length : 5\r\n\r\nhello",
		status: 200, body: "hello", reused: true},
	{name: "HeaderNameNotAToken", rfc: "RFC 9110 §5.1", wire: "HTTP/1.1 200 OK\r\nX A: b\r\nContent-Length: 5\r\n\r\nhello",
		rtErr: true},
	{name: "HeaderNameEmpty", rfc: "RFC 9110 §5.1", wire: "HTTP/1.1 200 OK\r\n: b\r\nContent-Length: 5\r\n\r\nhello",
		rtErr: true},
	{name: "HeaderValueControlByte", rfc: "RFC 9110 §5.5", wire: "HTTP/1.1 200 OK\r\nX-A: a\x01b\r\nContent-Length: 5\r\n\r\nhello",
		rtErr: true},
	{name: "HeaderValueBareCR", rfc: "RFC 9110 §5.5", wire: "HTTP/1.1 200 OK\r\nX-A: a\rContent-Length: 9\r\nContent-Length: 5\r\n\r\nhello",
		rtErr: true},
	{name: "HeadBareLF", rfc: "RFC 9112 §2.2 (a recipient may take LF alone)", wire: "HTTP/1.1 200 OK\nContent-Length: 5\n\nhello",
		status: 200, body: "hello", reused: true},
	{name: "ChunkedTrailerMalformed", rfc: "RFC 9112 §7.1.2, §5", wire: chunkedHead + "5\r\nhello\r\n0\r\nX-Checksum abc\r\n\r\n", close: true,
		status: 200, badBody: true},
	{name: "HeadCutShort", rfc: "RFC 9112 §8", wire: "HTTP/1.1 200 OK\r\nContent-Le", close: true,
		rtErr: true},
}

func TestUpstreamConformanceFraming(t *testing.T) {
	t.Parallel()
	for _, tc := range framingCases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			runFramingCase(t, tc)
		})
	}
}

// A head larger than the transport's bound fails the round trip without
// the transport buffering it (RFC 9112 §2.3: a recipient may bound what it
// accepts, and it must not hold an unbounded head in memory). The server
// sends far more than the bound and then waits: a client that kept reading
// would block until the watchdog, one that buffered it all would grow.
func TestUpstreamConformanceOversizeHead(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		line string // repeated without end
		head string // sent first
	}{
		{"ManyHeaderLines", "X-Pad: " + strings.Repeat("a", 1000) + "\r\n", "HTTP/1.1 200 OK\r\n"},
		{"OneEndlessLine", strings.Repeat("a", 1024), "HTTP/1.1 200 OK\r\nX-Pad: "},
		{"EndlessLineWithoutColon", strings.Repeat("a", 1024), "HTTP/1.1 200 OK\r\n"},
		{"EndlessStatusLine", strings.Repeat("a", 1024), "HTTP/1.1 200 "},
		{"EndlessInterimResponses", "HTTP/1.1 100 Continue\r\n\r\n", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var sent atomic.Int64
			srv := newWireServer(t, func(c *wireConn, _ int) {
				if _, err := c.readRequest(); err != nil {
					return
				}
				c.write(tc.head)
				for sent.Load() < 64<<20 {
					n, err := io.WriteString(c, tc.line)
					sent.Add(int64(n))
					if err != nil {
						return
					}
				}
				_, _ = c.readRequest() // wait, neither closing nor sending
			})
			resp, err := send(t, wireTransport(t), http.MethodPost, srv.url, "x")
			if err == nil {
				resp.Body.Close()
				t.Fatalf("a head of over %d bytes was accepted", sent.Load())
			}
			if errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("the client kept reading an endless head: %v", err)
			}
			if len(err.Error()) > 512 {
				t.Fatalf("error of %d bytes quotes the head", len(err.Error()))
			}
		})
	}
}

// Keep-alive (RFC 9112 §9.3): the connection of an answer read to its end
// carries the next request; one whose body was abandoned does not.
func TestUpstreamConformanceKeepAlive(t *testing.T) {
	t.Parallel()
	srv := newWireServer(t, func(c *wireConn, _ int) {
		c.eachRequest(func(int, string) bool {
			c.write("HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n0123456789")
			return true
		})
	})
	tr := wireTransport(t)
	for i := range 3 {
		if got := mustPost(t, tr, srv.url, "x"); got != "0123456789" {
			t.Fatalf("request %d: %q", i, got)
		}
	}
	if n := srv.conns.Load(); n != 1 {
		t.Fatalf("%d connections for 3 answers read to the end, want 1", n)
	}
	// Read in part and closed: the rest of the body is still on the wire,
	// so the connection cannot carry another request.
	resp, err := send(t, tr, http.MethodPost, srv.url, "x")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := resp.Body.Read(make([]byte, 3)); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	mustPost(t, tr, srv.url, "x")
	if n := srv.conns.Load(); n != 2 {
		t.Fatalf("%d connections, want 2: an abandoned body's connection was reused", n)
	}
}

// Retrying on an idle connection the server closed (RFC 9112 §9.3.1: a
// client may retry a request when the connection closed before any part of
// its answer arrived). The transport sends again once, on a new connection,
// and only when nothing was received.
func TestUpstreamConformanceServerClosedIdleConnection(t *testing.T) {
	t.Parallel()
	const ok = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
	for _, tc := range []struct {
		name string
		// after is what the first connection does with the second request
		// it reads.
		after func(c *wireConn)
		// retried: the request is sent again on a new connection.
		retried bool
	}{
		// The server closes while the request is on its way: the write
		// succeeds and the read sees the end of the stream.
		{"FIN", func(c *wireConn) { c.Close() }, true},
		// The same with an abortive close: the read sees a reset.
		{"RST", func(c *wireConn) { c.reset() }, true},
		// Part of an answer arrived: the request may have been acted on
		// and the failure is the server's, so it is not sent again.
		{"PartialAnswer", func(c *wireConn) { c.write("HTTP/1.1 200 OK\r\nContent-Le"); c.Close() }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got := make(chan string, 4)
			srv := newWireServer(t, func(c *wireConn, idx int) {
				c.eachRequest(func(i int, body string) bool {
					got <- body
					if idx == 0 && i == 1 {
						tc.after(c)
						return false
					}
					c.write(ok)
					return true
				})
			})
			tr := wireTransport(t)
			mustPost(t, tr, srv.url, "first")
			resp, err := send(t, tr, http.MethodPost, srv.url, "second")
			if !tc.retried {
				if err == nil {
					resp.Body.Close()
					t.Fatal("a request whose answer was cut after it began succeeded")
				}
				if n := srv.conns.Load(); n != 1 {
					t.Fatalf("sent again on a new connection after part of an answer (%d connections)", n)
				}
				return
			}
			if err != nil {
				t.Fatalf("the server closed an idle connection and the request failed: %v", err)
			}
			if b := readAll(t, resp); b != "ok" {
				t.Fatalf("body %q", b)
			}
			if n := srv.conns.Load(); n != 2 {
				t.Fatalf("%d connections, want 2", n)
			}
			for _, want := range []string{"first", "second", "second"} {
				if b := <-got; b != want {
					t.Fatalf("server saw request %q, want %q", b, want)
				}
			}
		})
	}

	// The idle connection closed before it was taken: the transport either
	// sees it closed, or sends and retries. Either way the request works.
	t.Run("ClosedWhileIdle", func(t *testing.T) {
		t.Parallel()
		closed := make(chan struct{})
		srv := newWireServer(t, func(c *wireConn, idx int) {
			if _, err := c.readRequest(); err != nil {
				return
			}
			c.write(ok)
			if idx == 0 {
				c.Close()
				close(closed)
				return
			}
			c.eachRequest(func(int, string) bool {
				c.write(ok)
				return true
			})
		})
		tr := wireTransport(t)
		mustPost(t, tr, srv.url, "x")
		<-closed
		resp, err := send(t, tr, http.MethodPost, srv.url, "x")
		if err != nil {
			t.Fatalf("request after the server closed the idle connection: %v", err)
		}
		readAll(t, resp)
	})

	// Sent again once only: a second closed connection fails the request.
	t.Run("RetriedOnce", func(t *testing.T) {
		t.Parallel()
		srv := newWireServer(t, func(c *wireConn, idx int) {
			c.eachRequest(func(i int, _ string) bool {
				if idx > 0 || i > 0 {
					return false // close without answering
				}
				c.write(ok)
				return true
			})
		})
		tr := wireTransport(t)
		mustPost(t, tr, srv.url, "x")
		if _, err := send(t, tr, http.MethodPost, srv.url, "x"); err == nil {
			t.Fatal("no error when the new connection closed too")
		}
		if n := srv.conns.Load(); n != 2 {
			t.Fatalf("%d connections, want 2 (one retry)", n)
		}
	})
}

// A new connection closed before any byte of an answer fails the round trip
// (RFC 9112 §8: an incomplete message), and is not retried: only a reused
// connection may have been closed as idle.
func TestUpstreamConformanceFreshConnectionClosed(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		close func(c *wireConn)
	}{
		{"FIN", func(c *wireConn) { c.Close() }},
		{"RST", func(c *wireConn) { c.reset() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := newWireServer(t, func(c *wireConn, _ int) {
				if _, err := c.readRequest(); err == nil {
					tc.close(c)
				}
			})
			_, err := send(t, wireTransport(t), http.MethodPost, srv.url, "x")
			if err == nil {
				t.Fatal("no error from a connection closed before answering")
			}
			if errors.Is(err, io.EOF) {
				// A caller relaying a body takes io.EOF for a clean end.
				t.Fatalf("error %v reads as io.EOF", err)
			}
			if n := srv.conns.Load(); n != 1 {
				t.Fatalf("%d connections, want 1: a fresh connection is not retried", n)
			}
		})
	}
}

// An answer without a body (RFC 9112 §6.3(1), or Content-Length: 0) frees
// its connection as soon as its head is read: the caller need not read the
// empty body for the connection to carry the next request.
func TestUpstreamConformanceNoBodyFreesConnection(t *testing.T) {
	t.Parallel()
	srv := newWireServer(t, func(c *wireConn, _ int) {
		c.eachRequest(func(i int, _ string) bool {
			if i%2 == 0 {
				c.write("HTTP/1.1 204 No Content\r\n\r\n")
			} else {
				c.write("HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
			}
			return true
		})
	})
	tr := wireTransport(t)
	for range 4 {
		resp, err := send(t, tr, http.MethodPost, srv.url, "x")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close() // not read
	}
	if n := srv.conns.Load(); n != 1 {
		t.Fatalf("%d connections for 4 answers without a body, want 1", n)
	}
}
