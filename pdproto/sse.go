package pdproto

import "bytes"

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
		line := event
		if nl := bytes.IndexByte(event, '\n'); nl >= 0 {
			line, event = event[:nl], event[nl+1:]
		} else {
			event = nil
		}
		line = bytes.TrimRight(line, "\r")
		if d, ok := bytes.CutPrefix(line, []byte("data:")); ok {
			return bytes.TrimSpace(d)
		}
	}
	return nil
}

// IsDone reports whether an event's payload is the end-of-stream marker.
func IsDone(data []byte) bool { return string(data) == "[DONE]" }
