package sim

import (
	"errors"
	"testing"

	"github.com/pdplane/pdplane/registry"
)

func TestParseRequest(t *testing.T) {
	t.Parallel()
	cfg := Config{Name: "t", Role: registry.RoleDecode}.WithDefaults()
	for _, tt := range []struct {
		name    string
		rt      route
		body    string
		field   string // "" when valid
		prompts int
		boots   int
		max     int
	}{
		{"chat", routeChat, `{"messages":[{"role":"user","content":"hi"}],"max_tokens":3}`, "", 1, 0, 3},
		{"chat parts", routeChat, `{"messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}],"max_completion_tokens":2,"max_tokens":9}`, "", 1, 0, 2},
		{"chat no messages", routeChat, `{"messages":[]}`, "messages", 0, 0, 0},
		{"chat n", routeChat, `{"messages":[{"role":"user","content":"hi"}],"n":2}`, "n", 0, 0, 0},
		{"completion ids", routeCompletions, `{"prompt":[1,2,3]}`, "", 1, 0, cfg.MaxTokensDefault},
		{"completion batch", routeCompletions, `{"prompt":["a","b"],"bootstrap_host":["h","h"],"bootstrap_port":[1,1],"bootstrap_room":[1,2]}`, "", 2, 2, cfg.MaxTokensDefault},
		{"completion batch ids", routeCompletions, `{"prompt":[[1],[2,3]]}`, "", 2, 0, cfg.MaxTokensDefault},
		{"completion empty", routeCompletions, `{"prompt":[]}`, "prompt", 0, 0, 0},
		{"completion bad max", routeCompletions, `{"prompt":"a","max_tokens":0}`, "max_tokens", 0, 0, 0},
		{"generate text", routeGenerate, `{"text":"a","sampling_params":{"max_new_tokens":5},"bootstrap_host":"h","bootstrap_port":8998,"bootstrap_room":7}`, "", 1, 1, 5},
		{"generate no prompt", routeGenerate, `{}`, "text", 0, 0, 0},
		{"generate room repeats", routeGenerate, `{"text":["a","b"],"bootstrap_host":["h","h"],"bootstrap_port":[1,1],"bootstrap_room":[3,3]}`, "bootstrap_room", 0, 0, 0},
		{"generate lists for one", routeGenerate, `{"text":"a","bootstrap_host":["h"],"bootstrap_port":[1],"bootstrap_room":[3]}`, "bootstrap_room", 0, 0, 0},
		{"room too big", routeGenerate, `{"text":"a","bootstrap_host":"h","bootstrap_room":9223372036854775808}`, "bootstrap_room", 0, 0, 0},
		{"host without room", routeGenerate, `{"text":"a","bootstrap_host":"h"}`, "bootstrap_host", 0, 0, 0},
		{"bad json", routeChat, `{`, "", 0, 0, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			q, err := parseRequest(tt.rt, []byte(tt.body), &cfg)
			if tt.field != "" || tt.name == "bad json" {
				var br *badRequest
				if !errors.As(err, &br) || br.field != tt.field {
					t.Fatalf("got %v, want a bad request naming %q", err, tt.field)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(q.prompts) != tt.prompts || len(q.bootstrap) != tt.boots || q.maxTokens != tt.max {
				t.Fatalf("prompts %d bootstrap %d max %d", len(q.prompts), len(q.bootstrap), q.maxTokens)
			}
		})
	}
}

// FuzzParseRequest: whatever the network sends, parsing answers a value or
// a *badRequest, never panics, and a parsed request is usable.
func FuzzParseRequest(f *testing.F) {
	for _, s := range []string{
		`{"messages":[{"role":"user","content":"hi"}]}`,
		`{"prompt":["a","b"],"bootstrap_host":["h","h"],"bootstrap_port":[1,null],"bootstrap_room":[1,2]}`,
		`{"text":"a","return_logprob":[true],"sampling_params":[{"max_new_tokens":2}]}`,
		`{"input_ids":[[1,2],[3]],"kv_transfer_params":{"do_remote_prefill":true,"remote_block_ids":[[1]]}}`,
	} {
		f.Add(0, s)
		f.Add(1, s)
		f.Add(2, s)
	}
	cfg := Config{Name: "t", Role: registry.RoleDecode}.WithDefaults()
	f.Fuzz(func(t *testing.T, rt int, body string) {
		q, err := parseRequest(route(((rt%3)+3)%3), []byte(body), &cfg)
		if err != nil {
			var br *badRequest
			if !errors.As(err, &br) {
				t.Fatalf("error %v is not a bad request", err)
			}
			return
		}
		if len(q.prompts) == 0 || q.maxTokens < 1 || (len(q.bootstrap) != 0 && len(q.bootstrap) != len(q.prompts)) {
			t.Fatalf("unusable request %+v", q)
		}
		for _, p := range q.prompts {
			if len(p) == 0 {
				t.Fatal("empty prompt")
			}
		}
	})
}
