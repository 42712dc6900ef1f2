package pdproto

import "testing"

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
