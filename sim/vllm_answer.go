package sim

import (
	"encoding/json"

	"github.com/pdplane/pdplane/pdproto"
)

// vLLM's answers, in the shape vLLM 0.32's OpenAI server writes them
// (vllm/entrypoints/openai/protocol.py: CompletionResponse,
// ChatCompletionResponse and their stream chunks, every optional member
// written, null when unset), as recorded from the real engine in
// testdata/vllm and held there by TestRecordedVLLMAnswers. The values the
// simulator has no use for are null; the members are there so that a
// client of the simulator meets what a client of vLLM meets.

// vllmFingerprint is vLLM's system_fingerprint: "vllm-<version>-<hash>".
const vllmFingerprint = "vllm-0.32.0-pdplanesim"

// jnull is a member vLLM writes as null here.
type jnull = *struct{}

// vllmKV is kv_transfer_params: the prefill's hand-off, or null.
type vllmKV struct{ p *pdproto.KVTransferParams }

func (k vllmKV) MarshalJSON() ([]byte, error) {
	if k.p == nil {
		return []byte("null"), nil
	}
	return json.Marshal(k.p)
}

type vllmUsage struct {
	PromptTokens            int   `json:"prompt_tokens"`
	TotalTokens             int   `json:"total_tokens"`
	CompletionTokens        int   `json:"completion_tokens"`
	PromptTokensDetails     jnull `json:"prompt_tokens_details"`
	CompletionTokensDetails jnull `json:"completion_tokens_details"`
}

func (a *answer) vllmUsage() *vllmUsage {
	u := a.usage()
	return &vllmUsage{PromptTokens: u.PromptTokens, TotalTokens: u.TotalTokens, CompletionTokens: u.CompletionTokens}
}

type vllmCompletionChoice struct {
	Index          int     `json:"index"`
	Text           string  `json:"text"`
	Logprobs       jnull   `json:"logprobs"`
	FinishReason   *string `json:"finish_reason"`
	StopReason     jnull   `json:"stop_reason"`
	TokenIDs       jnull   `json:"token_ids"`
	PromptLogprobs jnull   `json:"prompt_logprobs"`
	PromptTokenIDs jnull   `json:"prompt_token_ids"`
	RoutedExperts  jnull   `json:"routed_experts"`
}

type vllmCompletion struct {
	ID                string                 `json:"id"`
	Object            string                 `json:"object"`
	Created           int64                  `json:"created"`
	Model             string                 `json:"model"`
	Choices           []vllmCompletionChoice `json:"choices"`
	ServiceTier       jnull                  `json:"service_tier"`
	SystemFingerprint string                 `json:"system_fingerprint"`
	Usage             *vllmUsage             `json:"usage"`
	KVTransferParams  vllmKV                 `json:"kv_transfer_params"`
	ECTransferParams  jnull                  `json:"ec_transfer_params"`
	Metrics           jnull                  `json:"metrics"`
}

type vllmMessage struct {
	Role         string `json:"role"`
	Content      string `json:"content"`
	Refusal      jnull  `json:"refusal"`
	Annotations  jnull  `json:"annotations"`
	Audio        jnull  `json:"audio"`
	FunctionCall jnull  `json:"function_call"`
	Reasoning    jnull  `json:"reasoning"`
}

type vllmChatChoice struct {
	Index         int         `json:"index"`
	Message       vllmMessage `json:"message"`
	Logprobs      jnull       `json:"logprobs"`
	FinishReason  *string     `json:"finish_reason"`
	StopReason    jnull       `json:"stop_reason"`
	TokenIDs      jnull       `json:"token_ids"`
	RoutedExperts jnull       `json:"routed_experts"`
}

type vllmChat struct {
	ID                string           `json:"id"`
	Object            string           `json:"object"`
	Created           int64            `json:"created"`
	Model             string           `json:"model"`
	Choices           []vllmChatChoice `json:"choices"`
	ServiceTier       jnull            `json:"service_tier"`
	SystemFingerprint string           `json:"system_fingerprint"`
	Usage             *vllmUsage       `json:"usage"`
	PromptLogprobs    jnull            `json:"prompt_logprobs"`
	PromptTokenIDs    jnull            `json:"prompt_token_ids"`
	PromptText        jnull            `json:"prompt_text"`
	KVTransferParams  vllmKV           `json:"kv_transfer_params"`
	ECTransferParams  jnull            `json:"ec_transfer_params"`
	Metrics           jnull            `json:"metrics"`
}

// vllmObject is the non-streamed answer.
func (a *answer) vllmObject(q *genRequest) any {
	kv := vllmKV{a.kv}
	if q.route == routeChat {
		s := a.seqs[0]
		return vllmChat{ID: a.id, Object: "chat.completion", Created: a.created, Model: a.model,
			Choices:           []vllmChatChoice{{Message: vllmMessage{Role: "assistant", Content: s.text(s.n)}, FinishReason: strp(s.finish)}},
			SystemFingerprint: vllmFingerprint, Usage: a.vllmUsage(), KVTransferParams: kv}
	}
	o := vllmCompletion{ID: a.id, Object: "text_completion", Created: a.created, Model: a.model,
		SystemFingerprint: vllmFingerprint, Usage: a.vllmUsage(), KVTransferParams: kv}
	for i, s := range a.seqs {
		o.Choices = append(o.Choices, vllmCompletionChoice{Index: i, Text: q.echoText(i) + s.text(s.n), FinishReason: strp(s.finish)})
	}
	return o
}

// A chat stream: vLLM's first chunk carries the role and an empty content
// (with the prompt's token ids and text, null unless asked for), then one
// chunk a token, the last with the finish and stop reasons and the
// system fingerprint (serving_chat.py chat_completion_stream_generator).

type vllmDelta struct {
	Role    string `json:"role,omitempty"`
	Content string `json:"content"`
}

type vllmChunkChoice struct {
	Index        int        `json:"index"`
	Delta        *vllmDelta `json:"delta,omitempty"`
	Text         *string    `json:"text,omitempty"`
	Logprobs     jnull      `json:"logprobs"`
	FinishReason *string    `json:"finish_reason"`
	*vllmChunkEnd
}

// vllmChunkEnd is what a token's chunk adds to a choice: its token ids,
// and on a chat stream's last one (on every completion chunk) the stop
// reason.
type vllmChunkEnd struct {
	StopReason     *jnull `json:"stop_reason,omitempty"`
	PromptTokenIDs *jnull `json:"prompt_token_ids,omitempty"`
	TokenIDs       jnull  `json:"token_ids"`
}

type vllmChunk struct {
	ID                string            `json:"id"`
	Object            string            `json:"object"`
	Created           int64             `json:"created"`
	Model             string            `json:"model"`
	Choices           []vllmChunkChoice `json:"choices"`
	PromptTokenIDs    *jnull            `json:"prompt_token_ids,omitempty"`
	PromptText        *jnull            `json:"prompt_text,omitempty"`
	SystemFingerprint string            `json:"system_fingerprint,omitempty"`
	Usage             *vllmUsage        `json:"usage,omitempty"`
}

// nullMember is a member written as null (a non-nil *jnull).
var nullMember = new(jnull)

// vllmRoleChunk is a chat stream's first chunk, before any token.
func (a *answer) vllmRoleChunk(i int) vllmChunk {
	return vllmChunk{ID: a.id, Object: "chat.completion.chunk", Created: a.created, Model: a.model,
		Choices:        []vllmChunkChoice{{Index: i, Delta: &vllmDelta{Role: "assistant"}}},
		PromptTokenIDs: nullMember, PromptText: nullMember}
}

// vllmChunk renders token k of sequence i.
func (a *answer) vllmChunk(q *genRequest, i, k int, last bool) vllmChunk {
	s := a.seqs[i]
	_, tok, _ := outputToken(s.seed, k)
	c := vllmChunkChoice{Index: i, vllmChunkEnd: &vllmChunkEnd{}}
	object := "text_completion"
	if q.route == routeChat {
		object, c.Delta = "chat.completion.chunk", &vllmDelta{Content: tok}
	} else {
		// A completion chunk carries every member of its choice, null
		// until set (serving_completion.py completion_stream_generator).
		if k == 0 {
			tok = q.echoText(i) + tok
		}
		c.Text, c.StopReason, c.PromptTokenIDs = &tok, nullMember, nullMember
	}
	ch := vllmChunk{ID: a.id, Object: object, Created: a.created, Model: a.model}
	if last {
		c.FinishReason, c.StopReason = strp(s.finish), nullMember
		ch.SystemFingerprint = vllmFingerprint
	}
	ch.Choices = []vllmChunkChoice{c}
	return ch
}
