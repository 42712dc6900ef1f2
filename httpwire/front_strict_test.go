//go:build linux

package httpwire

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestFrontRefusesAmbiguousHeadsAsTheRFCSays sends heads that RFC 9112
// lets a server refuse, each followed by a valid request on the same
// connection (what a smuggler would hide there), and checks the RFC's
// behaviour, not net/http's (which reads them all and keeps the
// connection): a 400 that says Connection: close, then the end of the
// connection, no answer to the request behind it, and no handler run.
//
//   - §6.1: "A server MAY reject a request that contains both
//     Content-Length and Transfer-Encoding ... Regardless, the server MUST
//     close the connection after responding to such a request"; §6.3 item
//     3: such a message "ought to be handled as an error".
//   - §5.2: "A server that receives an obs-fold in a request message ...
//     MUST either reject the message by sending a 400 (Bad Request) ... or
//     replace each received obs-fold with one or more SP octets".
//   - §2.2: a recipient "MAY recognize a single LF as a line terminator"
//     (so a server may refuse it), and "A recipient of such a bare CR MUST
//     consider that element to be invalid or replace each bare CR with SP".
func TestFrontRefusesAmbiguousHeadsAsTheRFCSays(t *testing.T) {
	fs := startFront(t, 2*time.Second, time.Minute, echo)
	behind := rawPost("/generate", `{"smuggled":1}`)
	for name, raw := range map[string]string{
		"§6.1 length, then chunked":        "POST /generate HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
		"§6.1 chunked, then length":        "POST /generate HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n",
		"§6.1 names in another case":       "POST /v1/completions HTTP/1.1\r\nHost: t\r\ncontent-length: 5\r\nTRANSFER-ENCODING: chunked\r\n\r\n0\r\n\r\n",
		"§6.1 on a route net/http serves":  "PUT /api/v1/peers/x/probe HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
		"§6.1 a GET":                       "GET /v1/models HTTP/1.1\r\nHost: t\r\nContent-Length: 0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
		"§5.2 a line folded with a space":  "POST /generate HTTP/1.1\r\nHost: t\r\nX-A: 1\r\n 2\r\nContent-Length: 2\r\n\r\n{}",
		"§5.2 a line folded with a tab":    "POST /generate HTTP/1.1\r\nHost: t\r\nX-A: 1\r\n\t2\r\nContent-Length: 2\r\n\r\n{}",
		"§5.2 a folded length":             "POST /generate HTTP/1.1\r\nHost: t\r\nContent-Length:\r\n 2\r\n\r\n{}",
		"§2.2 bare LF throughout":          "POST /generate HTTP/1.1\nHost: t\nContent-Length: 2\n\n{}",
		"§2.2 one bare LF":                 "POST /generate HTTP/1.1\r\nHost: t\nContent-Length: 2\r\n\r\n{}",
		"§2.2 a head ended by LF CRLF":     "POST /generate HTTP/1.1\r\nHost: t\r\nContent-Length: 2\n\r\n{}",
		"§2.2 a bare LF on another method": "DELETE /api/v1/peers/x HTTP/1.1\nHost: t\n\n",
		"§2.2 a bare CR in a value":        "POST /generate HTTP/1.1\r\nHost: t\r\nX-A: a\rb\r\nContent-Length: 2\r\n\r\n{}",
		"§2.2 a bare CR ending a line":     "POST /generate HTTP/1.1\r\nHost: t\rContent-Length: 2\r\n\r\n{}",
	} {
		t.Run(name, func(t *testing.T) {
			before := fs.byFront.Load() + fs.byNetHTP.Load()
			c, br := fs.dial(t)
			if _, err := io.WriteString(c, raw+behind); err != nil {
				t.Fatal(err)
			}
			resp, body := readAnswer(t, br)
			if resp.StatusCode != http.StatusBadRequest || !resp.Close || !strings.Contains(body, "RFC 9112 §"+name[2:5]) {
				t.Fatalf("answer %d (Connection: close %v) %q; want 400, closing, citing %s", resp.StatusCode, resp.Close, body, name[:5])
			}
			_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
			if rest, err := io.ReadAll(br); err != nil || len(rest) > 0 {
				t.Fatalf("after the 400: %q, %v; want the connection closed with nothing more", rest, err)
			}
			if n := fs.byFront.Load() + fs.byNetHTP.Load() - before; n != 0 {
				t.Fatalf("%d request(s) of the connection reached the handler", n)
			}
		})
	}

	// The same requests, framed as the RFC wants, are served, and the
	// connection is kept.
	c, br := fs.dial(t)
	for _, raw := range []string{
		"POST /generate HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
		"POST /generate HTTP/1.1\r\nHost: t\r\nX-A: 1 2\r\nContent-Length: 2\r\n\r\n{}",
	} {
		if _, err := io.WriteString(c, raw); err != nil {
			t.Fatal(err)
		}
		if resp, body := readAnswer(t, br); resp.StatusCode != http.StatusOK || body != "{}" || resp.Close {
			t.Fatalf("%q: %d %q (close %v)", raw, resp.StatusCode, body, resp.Close)
		}
	}
}
