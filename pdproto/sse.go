package pdproto

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
)

// Done is the event that ends an OpenAI-style stream; SGLang ends /generate
// streams with it too (http_server.generate_request).
const Done = "data: [DONE]\n\n"

// AppendEvent appends one SSE event carrying data as its single data line,
// the way both engines frame every event: "data: " + payload + blank line.
func AppendEvent(dst, data []byte) []byte {
	dst = append(dst, "data: "...)
	dst = append(dst, data...)
	return append(dst, "\n\n"...)
}

// NextEvent splits the first event off b: the event up to and including its
// blank line, and whether one was complete (when not, event is all of b).
// Both "\n\n" and "\r\n\r\n" end an event.
func NextEvent(b []byte) (event, rest []byte, complete bool) {
	i := bytes.Index(b, []byte("\n\n"))
	j := bytes.Index(b, []byte("\r\n\r\n"))
	switch {
	case i >= 0 && (j < 0 || i < j):
		return b[:i+2], b[i+2:], true
	case j >= 0:
		return b[:j+4], b[j+4:], true
	}
	return b, nil, false
}

// EventData returns the payload of an event's first "data:" line, trimmed,
// or nil when it has none.
func EventData(event []byte) []byte {
	for len(event) > 0 {
		var line []byte
		line, event = nextLine(event)
		if d, ok := bytes.CutPrefix(line, []byte("data:")); ok {
			return bytes.TrimSpace(d)
		}
	}
	return nil
}

// IsDone reports whether an event's payload is the end-of-stream marker.
func IsDone(data []byte) bool { return string(data) == "[DONE]" }

// The shapes an engine's 2xx answer must have before the router relays any
// of it. SGLang and vLLM answer a generation request with JSON
// (application/json), or, streamed, with server-sent events
// (text/event-stream) whose data is JSON or [DONE]. Anything else (a
// broken engine, a proxy's error page, a stream to a request that asked
// for none) fails the attempt, which another pair may serve, instead of
// reaching the client as an answer.

// CheckStreamStart checks a streamed answer's media type and, in start
// (its first bytes; ended: all of them), its first event. A first event
// longer than what the router holds back is not judged: it is relayed as
// it comes (a long prompt's logprobs may fill one).
func CheckStreamStart(contentType string, start []byte, ended bool) error {
	if !mediaType(contentType, "text/event-stream") {
		return fmt.Errorf("a streamed answer of type %q, want text/event-stream", contentType)
	}
	first, _, complete := NextEvent(start)
	switch {
	case complete:
		return CheckEvent(first)
	case ended:
		return fmt.Errorf("a stream that ended before its first event (%d bytes)", len(start))
	}
	return nil
}

// CheckEvent checks one event's lines: empty, a comment, or a field SSE
// defines, whose data is JSON or [DONE].
func CheckEvent(event []byte) error {
	for len(event) > 0 {
		var line []byte
		line, event = nextLine(event)
		switch {
		case len(line) == 0, line[0] == ':':
		case bytes.HasPrefix(line, []byte("data:")):
			d := bytes.TrimSpace(line[len("data:"):])
			if !IsDone(d) && !json.Valid(d) {
				return fmt.Errorf("an event whose data is not JSON: %.64q", d)
			}
		case bytes.HasPrefix(line, []byte("event:")), bytes.HasPrefix(line, []byte("id:")), bytes.HasPrefix(line, []byte("retry:")):
		default:
			return fmt.Errorf("not a server-sent event: %.64q", line)
		}
	}
	return nil
}

// StreamGuard checks a stream's framing as the router relays it, after its
// first event (CheckStreamStart): every line empty, a comment, or a field
// SSE defines, a data line's value starting as JSON does ('{', or '[' as
// [DONE] does too). That is what both engines write: SGLang's /generate
// yields b"data: " + orjson.dumps(out) + b"\n\n", then b"data: [DONE]\n\n"
// (python/sglang/srt/entrypoints/http_server.py, generate_request), and
// every stream of the real-engine suite's vLLM passes through it. It judges
// a line by its first bytes and skips the rest
// (bytes.IndexByte), so that a token's chunk costs next to nothing; a
// payload broken inside its braces is not seen. The zero value is ready, at
// the start of a line.
type StreamGuard struct {
	head [16]byte // the current line's first bytes
	n    int      // of head, held
	done bool     // the current line is judged: skip to its end
}

// Check reads the next bytes of the stream. It returns how many of b may
// be relayed: len(b), or, when a line is not a server-sent event's, the
// offset in b where that line begins (0 when it began in an earlier b), with
// the error saying why. A stream found bad stays bad: Check is not called
// again.
func (g *StreamGuard) Check(b []byte) (int, error) {
	start := 0 // where the current line began in b
	for i := 0; i < len(b); {
		if g.done {
			j := bytes.IndexByte(b[i:], '\n')
			if j < 0 {
				return len(b), nil
			}
			i += j + 1
			g.done, g.n, start = false, 0, i
			continue
		}
		c := b[i]
		i++
		if c == '\n' || c == '\r' {
			if _, err := judgeLine(g.head[:g.n], true); err != nil {
				return start, err
			}
			g.n, start = 0, i
			continue
		}
		if g.n < len(g.head) {
			g.head[g.n] = c
			g.n++
		}
		if g.n < len("event:") && g.head[0] != ':' {
			continue // no field is told from another in fewer bytes
		}
		decided, err := judgeLine(g.head[:g.n], g.n == len(g.head))
		if err != nil {
			return start, err
		}
		g.done = decided
	}
	return len(b), nil
}

// sseFields are the fields an event's line may set.
var sseFields = [...]string{"data:", "event:", "id:", "retry:"}

// judgeLine judges a line by its first bytes p; whole says p is the whole
// line or all of it that will be read. decided is false while p cannot
// tell yet.
func judgeLine(p []byte, whole bool) (decided bool, err error) {
	if len(p) == 0 {
		return whole, nil
	}
	if p[0] == ':' {
		return true, nil // a comment
	}
	for _, f := range sseFields {
		switch {
		case bytes.HasPrefix(p, []byte(f)):
			if f != "data:" {
				return true, nil
			}
			v := bytes.TrimLeft(p[len(f):], " ")
			switch {
			case len(v) == 0:
				return whole, nil
			case v[0] == '{' || v[0] == '[':
				return true, nil
			}
			return true, fmt.Errorf("an event whose data is not JSON: %.64q", p)
		case bytes.HasPrefix([]byte(f), p) && !whole:
			return false, nil
		}
	}
	return true, fmt.Errorf("not a server-sent event: %.64q", p)
}

// CheckUnary checks a non-streamed answer's media type and body: a JSON
// object (an array for a batch of SGLang's /generate), whole when
// complete, else its start.
func CheckUnary(contentType string, body []byte, complete bool) error {
	if !mediaType(contentType, "application/json") {
		return fmt.Errorf("an answer of type %q, want application/json", contentType)
	}
	b := bytes.TrimLeft(body, " \t\r\n")
	switch {
	case len(b) == 0 || b[0] != '{' && b[0] != '[':
		return fmt.Errorf("an answer that is not a JSON object: %.64q", body)
	case complete && !json.Valid(b):
		return fmt.Errorf("an answer that is not JSON: %.64q", body)
	}
	return nil
}

// mediaType reports whether a Content-Type names want, whatever its
// parameters.
func mediaType(contentType, want string) bool {
	mt, _, _ := strings.Cut(contentType, ";")
	return strings.EqualFold(strings.TrimSpace(mt), want)
}

// nextLine splits b's first line, without its line ending, from the rest.
func nextLine(b []byte) (line, rest []byte) {
	line = b
	if nl := bytes.IndexByte(b, '\n'); nl >= 0 {
		line, rest = b[:nl], b[nl+1:]
	}
	return bytes.TrimRight(line, "\r"), rest
}
