package pdproto

import (
	"strings"
	"testing"
)

func TestNextEvent(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in, event, rest string
		complete        bool
	}{
		{"data: a\n\ndata: b\n\n", "data: a\n\n", "data: b\n\n", true},
		{"data: a\r\n\r\ndata: b", "data: a\r\n\r\n", "data: b", true},
		{"data: a\n", "data: a\n", "", false},
		{"data: a\n\r\n\r\n", "data: a\n\r\n\r\n", "", true},
	} {
		ev, rest, ok := NextEvent([]byte(tc.in))
		if string(ev) != tc.event || string(rest) != tc.rest || ok != tc.complete {
			t.Errorf("NextEvent(%q) = %q, %q, %v; want %q, %q, %v", tc.in, ev, rest, ok, tc.event, tc.rest, tc.complete)
		}
	}
}

func TestEventData(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"data: {\"a\":1}\n\n":         `{"a":1}`,
		"data:{\"a\":1}\r\n\r\n":      `{"a":1}`,
		": comment\ndata: [DONE]\n\n": "[DONE]",
		"event: x\n\n":                "",
	} {
		if got := string(EventData([]byte(in))); got != want {
			t.Errorf("EventData(%q) = %q, want %q", in, got, want)
		}
	}
	if got := string(AppendEvent(nil, []byte(`{}`))); got != "data: {}\n\n" {
		t.Errorf("AppendEvent = %q", got)
	}
	if !IsDone(EventData([]byte(Done))) {
		t.Error("Done is not done")
	}
}

// TestAnswerChecks pins what the router accepts of an engine's 2xx answer
// before relaying it, with SGLang's and vLLM's real shapes among the cases
// (sim/testdata/vllm holds vLLM 0.32's recorded answers; SGLang's
// serving_chat sends "data: {json}\n\n" events and ORJSONResponse bodies).
func TestAnswerChecks(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		stream   bool
		ctype    string
		body     string
		complete bool
		ok       bool
	}{
		{"vLLM chat chunk", true, "text/event-stream; charset=utf-8", `data: {"id":"chatcmpl-1","object":"chat.completion.chunk","choices":[]}` + "\n\n", true, true},
		{"CRLF framing", true, "text/event-stream", "data: {\"a\":1}\r\n\r\n", true, true},
		{"the end marker", true, "text/event-stream", "data: [DONE]\n\n", true, true},
		{"a comment and fields", true, "text/event-stream", ": ping\nevent: message\nid: 7\nretry: 100\ndata: {}\n\n", true, true},
		{"a stream as plain text", true, "text/plain", "data: {}\n\n", true, false},
		{"garbage bytes", true, "text/event-stream", "\x00\xffnot an answer\r\n<html>502</html>\n\n", true, false},
		{"data that is not JSON", true, "text/event-stream", "data: hello\n\n", true, false},
		{"a stream that ended before its first event", true, "text/event-stream", "data: {\"a\"", false, false},
		{"a JSON body", false, "application/json", `{"id":"cmpl-1","choices":[]}`, true, true},
		{"SGLang's batch", false, "application/json", `[{"text":"a"},{"text":"b"}]`, true, true},
		{"the start of a long body", false, "application/json; charset=utf-8", `{"id":"cmpl-1","choices":[{"text":"abc`, false, true},
		{"an SSE body to a request that asked for none", false, "text/event-stream", "data: {}\n\n", true, false},
		{"garbage with 200", false, "text/plain", "\x00\xffnot an answer", true, false},
		{"a JSON type on HTML", false, "application/json", "<html>502 Bad Gateway</html>", true, false},
		{"a cut JSON body", false, "application/json", `{"id":"cmpl-1","choi`, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var err error
			if tc.stream {
				err = CheckStreamStart(tc.ctype, []byte(tc.body), true) // the stream ended there
			} else {
				err = CheckUnary(tc.ctype, []byte(tc.body), tc.complete)
			}
			if (err == nil) != tc.ok {
				t.Fatalf("err = %v, want ok %v", err, tc.ok)
			}
		})
	}
}

// TestLongFirstEventIsNotJudged: a first event longer than the router holds
// back (a long prompt's logprobs) is relayed as it comes, not failed as a
// stream that never began.
func TestLongFirstEventIsNotJudged(t *testing.T) {
	t.Parallel()
	start := []byte(`data: {"meta_info":{"input_token_logprobs":[` + strings.Repeat("[-0.5,17,null],", 5000))
	if err := CheckStreamStart("text/event-stream", start, false); err != nil {
		t.Fatalf("the start of a long first event: %v", err)
	}
	if err := CheckStreamStart("text/event-stream", start, true); err == nil {
		t.Fatal("a stream that ended inside its first event passed")
	}
}

// TestStreamGuard feeds streams in writes of every size: a stream of
// well-framed events passes whole; in one with a bad line, what may be
// relayed ends where that line begins when one write holds it, and at most
// the line's first 15 bytes later when it was split before it could be
// judged.
func TestStreamGuard(t *testing.T) {
	t.Parallel()
	good := "data: {\"choices\":[{\"text\":\"a\"}]}\n\n: keep-alive\n\nevent: message\nid: 7\nretry: 10\ndata:{\"x\":1}\r\n\r\ndata: [DONE]\n\n"
	for _, tc := range []struct {
		name, stream string
		bad          int // offset of the bad line; -1: none
	}{
		{"good", good, -1},
		{"html after an event", "data: {\"a\":1}\n\n<html>oops</html>\n", len("data: {\"a\":1}\n\n")},
		{"data that is not JSON", "data: {\"a\":1}\n\ndata: oops\n\n", len("data: {\"a\":1}\n\n")},
		{"a field SSE does not define", "data: {\"a\":1}\ndatum: 1\n\n", len("data: {\"a\":1}\n")},
		{"a short bad line", "data: {}\n\nda\n", len("data: {}\n\n")},
		{"spaces then JSON", "data:      {}\n\n", -1},
		{"bytes at the very start", "HTTP/1.1 200 OK\r\n", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			for size := 1; size <= len(tc.stream); size++ {
				var g StreamGuard
				relayed, failed := 0, false
				for at := 0; at < len(tc.stream) && !failed; at += size {
					w := []byte(tc.stream[at:min(at+size, len(tc.stream))])
					n, err := g.Check(w)
					relayed += n
					if err != nil {
						failed = true
					} else if n != len(w) {
						t.Fatalf("writes of %d: %d of %d bytes passed without an error", size, n, len(w))
					}
				}
				switch {
				case tc.bad < 0 && (failed || relayed != len(tc.stream)):
					t.Fatalf("writes of %d: a good stream failed after %d bytes", size, relayed)
				case tc.bad >= 0 && !failed:
					t.Fatalf("writes of %d: the bad line at %d passed", size, tc.bad)
				case tc.bad >= 0 && size == len(tc.stream) && relayed != tc.bad:
					t.Fatalf("one write: %d bytes relayed, want the stream cut at %d", relayed, tc.bad)
				case tc.bad >= 0 && (relayed > tc.bad+15 || relayed < tc.bad-size+1):
					t.Fatalf("writes of %d: %d bytes relayed, want the stream cut within the first 15 bytes of the line at %d", size, relayed, tc.bad)
				}
			}
		})
	}
}

func BenchmarkStreamGuard(b *testing.B) {
	chunk := []byte("data: {\"id\":\"cmpl-1\",\"object\":\"text_completion\",\"choices\":[{\"index\":0,\"text\":\" token\",\"finish_reason\":null}],\"usage\":null}\n\n")
	b.SetBytes(int64(len(chunk)))
	var g StreamGuard
	for b.Loop() {
		if _, err := g.Check(chunk); err != nil {
			b.Fatal(err)
		}
	}
}
