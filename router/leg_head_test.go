package router

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/pdplane/pdplane/httpwire"
)

// TestLegHeadAsHTTPRequest pins that a leg sent by the router's own
// transport (appendLegHead, no http.Request) carries the head a leg built as
// an http.Request (newUpstream with another transport)
// does: the same line, Host, length and fields, the engines' key and the
// client's trace context included, for a URL with a port and one without.
func TestLegHeadAsHTTPRequest(t *testing.T) {
	body := []byte(`{"model":"m","bootstrap_room":7}`)
	client := &http.Request{Header: http.Header{}}
	client.Header.Set(traceparentField, "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
	client.Header.Set(tracestateField, "vendor=x")
	for _, raw := range []string{"http://10.0.0.7:30000/v1/chat/completions", "http://engine.local/generate?x=1"} {
		tg := newLegTarget(raw)
		if !tg.plain {
			t.Fatalf("%s: not a plain target", raw)
		}
		d := &dispatch{rt: &Router{upstreamAuth: "Bearer engine-key"}, rid: "req-42", r: client}
		viaRequest, err := d.newUpstream(context.Background(), &tg, body)
		if err != nil || viaRequest.req == nil {
			t.Fatalf("%s: newUpstream without the own transport: %+v, %v", raw, viaRequest, err)
		}
		want := httpwire.AppendRequestHead(nil, viaRequest.req, len(body))

		d.rt.ownedTr = httpwire.NewTransport(httpwire.TransportConfig{})
		direct, err := d.newUpstream(context.Background(), &tg, body)
		if err != nil || direct.req != nil {
			t.Fatalf("%s: newUpstream with the own transport built an http.Request: %+v, %v", raw, direct, err)
		}
		got := d.appendLegHead(nil, direct)

		parse := func(head []byte) *http.Request {
			r, err := http.ReadRequest(bufio.NewReader(strings.NewReader(string(head))))
			if err != nil {
				t.Fatalf("%s: %v in %q", raw, err, head)
			}
			return r
		}
		w, g := parse(want), parse(got)
		if g.Method != w.Method || g.RequestURI != w.RequestURI || g.Host != w.Host || g.ContentLength != w.ContentLength ||
			fmt.Sprint(g.Header) != fmt.Sprint(w.Header) {
			t.Fatalf("%s: heads differ:\n got %q\nwant %q", raw, got, want)
		}
		if g.Header.Get("Authorization") != "Bearer engine-key" || g.Header.Get("X-Request-Id") != "req-42" ||
			g.Header.Get(tracestateField) != "vendor=x" || g.ContentLength != int64(len(body)) {
			t.Fatalf("%s: head lacks a field: %q", raw, got)
		}
		if want := httpwire.DialAddr(viaRequest.req.URL); tg.addr != want {
			t.Fatalf("%s: dials %q, want %q", raw, tg.addr, want)
		}
	}
	if tg := newLegTarget("https://engine.example:443/generate"); tg.plain {
		t.Fatal("an https target must go through an http.Request")
	}
}
