package sim_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/sim/simtest"
)

// TestCompletionsEcho: /v1/completions with echo puts the prompt in front
// of the completion, whole when not streamed and in the first chunk when
// streamed; without echo the prompt is not there.
func TestCompletionsEcho(t *testing.T) {
	t.Parallel()
	d := simtest.Start(t, simtest.Config("d0", registry.RoleDecode, registry.EngineVLLM))
	c := simtest.NewClient()
	const prompt = "say it back"
	text := func(body []byte) string {
		var a struct {
			Choices []struct {
				Text string `json:"text"`
			} `json:"choices"`
		}
		if err := json.Unmarshal(body, &a); err != nil || len(a.Choices) != 1 {
			t.Fatalf("answer %s: %v", body, err)
		}
		return a.Choices[0].Text
	}
	for _, echo := range []bool{true, false} {
		r, err := c.Post(context.Background(), d.URL(), "/v1/completions", map[string]any{"model": "sim-model", "prompt": prompt, "max_tokens": 3, "echo": echo}, nil)
		if err != nil || r.Status != 200 {
			t.Fatalf("%v %d %s", err, r.Status, r.Body)
		}
		if got := text(r.Body); strings.HasPrefix(got, prompt) != echo || len(got) <= len(prompt) && echo {
			t.Fatalf("echo %v: text %q", echo, got)
		}
	}
	r, err := c.Post(context.Background(), d.URL(), "/v1/completions", map[string]any{"model": "sim-model", "prompt": prompt, "max_tokens": 3, "echo": true, "stream": true}, nil)
	if err != nil || r.Status != 200 {
		t.Fatalf("%v %d %s", err, r.Status, r.Body)
	}
	events, done := simtest.Events(r.Body)
	if !done || len(events) != 3 {
		t.Fatalf("%d events, done %v: %s", len(events), done, r.Body)
	}
	if got := text(events[0]); !strings.HasPrefix(got, prompt) {
		t.Fatalf("first chunk %q", got)
	}
	if got := text(events[1]); strings.Contains(got, prompt) {
		t.Fatalf("second chunk %q", got)
	}
	r, _ = c.Post(context.Background(), d.URL(), "/v1/completions", map[string]any{"model": "sim-model", "prompt": []int{1, 2, 3}, "echo": true}, nil)
	if r.Status != 400 {
		t.Fatalf("echo of token ids: %d %s", r.Status, r.Body)
	}
}
