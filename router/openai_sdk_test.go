package router_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/router"
	"github.com/pdplane/pdplane/router/routertest"
)

// TestOpenAISDK drives the router with the official OpenAI Go SDK: a
// streamed chat completion over an SGLang pair and a vLLM pair, a plain
// completion, and the model list.
func TestOpenAISDK(t *testing.T) {
	t.Parallel()
	for _, engine := range []registry.Engine{registry.EngineSGLang, registry.EngineVLLM} {
		t.Run(string(engine), func(t *testing.T) {
			t.Parallel()
			var p, d *routertest.Fake
			if engine == registry.EngineSGLang {
				p = routertest.StartSGLang(t, "p1", registry.RolePrefill).Fake
				d = routertest.StartSGLang(t, "d1", registry.RoleDecode).Fake
			} else {
				p = routertest.StartVLLM(t, "p1", registry.RolePrefill).Fake
				d = routertest.StartVLLM(t, "d1", registry.RoleDecode).Fake
			}
			d.SetBehavior(routertest.Behavior{Chunks: 5, ChunkPause: time.Millisecond})
			b := setup(t, router.Config{APIKeys: []string{"sk-test"}}, p.Peer(model), d.Peer(model))

			client := openai.NewClient(
				option.WithBaseURL(b.srv.URL+"/v1/"),
				option.WithAPIKey("sk-test"),
				option.WithMaxRetries(0),
			)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()

			stream := client.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{
				Model:    model,
				Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Say hello.")},
			})
			var text strings.Builder
			chunks := 0
			acc := openai.ChatCompletionAccumulator{}
			for stream.Next() {
				c := stream.Current()
				acc.AddChunk(c)
				chunks++
				if len(c.Choices) > 0 {
					text.WriteString(c.Choices[0].Delta.Content)
				}
			}
			if err := stream.Err(); err != nil {
				t.Fatalf("stream: %v", err)
			}
			if chunks != 5 || text.String() != "d1-tok0 d1-tok1 d1-tok2 d1-tok3 d1-tok4 " {
				t.Fatalf("%d chunks, text %q", chunks, text.String())
			}
			if len(acc.Choices) != 1 || acc.Choices[0].FinishReason != "stop" || acc.Model != model {
				t.Fatalf("accumulated %+v", acc.ChatCompletion)
			}

			comp, err := client.Completions.New(ctx, openai.CompletionNewParams{
				Model:  openai.CompletionNewParamsModel(model),
				Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("Once upon")},
			})
			if err != nil || len(comp.Choices) != 1 || !strings.HasPrefix(comp.Choices[0].Text, "d1-tok0") {
				t.Fatalf("completion %+v: %v", comp, err)
			}

			page, err := client.Models.List(ctx)
			if err != nil || len(page.Data) != 1 || page.Data[0].ID != model {
				t.Fatalf("models %+v: %v", page, err)
			}

			// A wrong key surfaces as the SDK's API error with our code.
			bad := openai.NewClient(option.WithBaseURL(b.srv.URL+"/v1/"), option.WithAPIKey("nope"), option.WithMaxRetries(0))
			_, err = bad.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
				Model:    model,
				Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")},
			})
			var apiErr *openai.Error
			if err == nil || !errors.As(err, &apiErr) || apiErr.StatusCode != 401 || apiErr.Code != "invalid_api_key" {
				t.Fatalf("bad key: %v", err)
			}
		})
	}
}
