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
	"github.com/pdplane/pdplane/sim"
	"github.com/pdplane/pdplane/sim/simtest"
)

// TestOpenAISDK drives the router with the official OpenAI Go SDK over
// simulated SGLang and vLLM pairs: a streamed chat completion (its text is
// the one the engines generate for the prompt, the same as unstreamed), a
// plain completion, and the model list.
func TestOpenAISDK(t *testing.T) {
	t.Parallel()
	for _, engine := range []registry.Engine{registry.EngineSGLang, registry.EngineVLLM} {
		t.Run(string(engine), func(t *testing.T) {
			t.Parallel()
			p, d := simtest.Pair(t, engine, nil)
			b := setupSims(t, router.Config{APIKeys: []string{"sk-test"}}, p, d)
			const model = sim.DefaultModel

			client := openai.NewClient(
				option.WithBaseURL(b.srv.URL+"/v1/"),
				option.WithAPIKey("sk-test"),
				option.WithMaxRetries(0),
			)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()

			params := openai.ChatCompletionNewParams{
				Model:     model,
				Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Say hello.")},
				MaxTokens: openai.Int(5),
			}
			stream := client.Chat.Completions.NewStreaming(ctx, params)
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
			whole, err := client.Chat.Completions.New(ctx, params)
			if err != nil || len(whole.Choices) != 1 {
				t.Fatalf("chat completion %+v: %v", whole, err)
			}
			if chunks < 5 || text.String() == "" || text.String() != whole.Choices[0].Message.Content {
				t.Fatalf("%d chunks, streamed text %q, unstreamed %q", chunks, text.String(), whole.Choices[0].Message.Content)
			}
			if len(acc.Choices) != 1 || acc.Choices[0].FinishReason != "length" || acc.Model != model {
				t.Fatalf("accumulated %+v", acc.ChatCompletion)
			}
			if st := d.Stats(); st.Transfers != 2 {
				t.Fatalf("the decode received KV %d times for 2 requests", st.Transfers)
			}

			comp, err := client.Completions.New(ctx, openai.CompletionNewParams{
				Model:  openai.CompletionNewParamsModel(model),
				Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("Once upon")},
			})
			if err != nil || len(comp.Choices) != 1 || comp.Choices[0].Text == "" {
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
