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
