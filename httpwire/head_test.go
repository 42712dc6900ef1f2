package httpwire

import (
	"bufio"
	"maps"
	"net/http"
	"net/textproto"
	"slices"
	"strings"
	"testing"
)

// FuzzParseHeadAgreesWithTextproto holds the router's head parser to
// net/textproto's on every head both accept: the same status and the same
// fields, in the same order. Where they differ in what they accept, the
// difference is one of the two documented in upstream_head.go.
func FuzzParseHeadAgreesWithTextproto(f *testing.F) {
	for _, s := range []string{
		"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: 5\r\n\r\n",
		"HTTP/1.1 200 OK\r\ncontent-type: a\r\nX-Multi: 1\r\nx-multi: 2\r\n\r\n",
		"HTTP/1.0 503 Busy\r\nRetry-After:   3  \r\n\r\n",
		"HTTP/1.1 200 OK\nA: b\n\n",
		"HTTP/1.1 200 OK\r\nX-Obs: caf\xc3\xa9\r\n\r\n",
		"HTTP/1.1 200 OK\r\nX-Empty:\r\n\r\n",
		// uvicorn 0.54.0's head for a Starlette StreamingResponse (lower-case names).
		"HTTP/1.1 200 OK\r\ndate: Tue, 01 Dec 2026 18:57:51 GMT\r\nserver: uvicorn\r\ncontent-type: text/event-stream; charset=utf-8\r\nTransfer-Encoding: chunked\r\n\r\n",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, wire string) {
		head, _, err := readHeadInto(bufio.NewReader(strings.NewReader(wire)), nil, true)
		if err != nil {
			return
		}
		got, err := parseHead(head, nil)
		if err != nil {
			return
		}
		if strings.Contains(head, " :") || strings.Contains(head, "\t:") {
			return // whitespace before a colon: removed here, kept uncanonicalised there
		}
		tp := textproto.NewReader(bufio.NewReader(strings.NewReader(head)))
		if _, err := tp.ReadLine(); err != nil {
			t.Fatalf("textproto cannot read the status line of %q: %v", head, err)
		}
		want, err := tp.ReadMIMEHeader()
		if err != nil {
			t.Fatalf("accepted here, refused by textproto: %q: %v", head, err)
		}
		if !maps.EqualFunc(got.Header, http.Header(want), slices.Equal) {
			t.Fatalf("head %q: fields %q, textproto's %q", head, got.Header, want)
		}
	})
}

func TestReadHeadIntoStopsAtTheEmptyLine(t *testing.T) {
	br := bufio.NewReaderSize(strings.NewReader("HTTP/1.1 200 OK\r\nA: "+strings.Repeat("x", 100)+"\r\n\r\nbody"), 16)
	head, _, err := readHeadInto(br, nil, true)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(head, "\r\n\r\n") || strings.Contains(head, "body") {
		t.Fatalf("head %q", head)
	}
	rest, _ := br.ReadString(0)
	if rest != "body" {
		t.Fatalf("after the head: %q, want the body", rest)
	}
	// A trailer section may be its empty line alone.
	sec, _, err := readHeadInto(bufio.NewReader(strings.NewReader("\r\nnext")), nil, false)
	if err != nil || sec != "\r\n" {
		t.Fatalf("empty trailer section: %q, %v", sec, err)
	}
	if h, err := parseFields(sec); err != nil || len(h) != 0 {
		t.Fatalf("empty trailer section parsed as %v, %v", h, err)
	}
}
