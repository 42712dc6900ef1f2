package sim

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"

	"github.com/pdplane/pdplane/pdproto"
	"github.com/pdplane/pdplane/registry"
)

// route is the generation endpoint a request came in on.
type route int

// Generation endpoints.
const (
	routeChat        route = iota // /v1/chat/completions
	routeCompletions              // /v1/completions
	routeGenerate                 // /generate (SGLang native)
)

// rawRequest is the part of a generation body the simulator reads; the
// polymorphic fields stay raw until parse looks at them.
type rawRequest struct {
	Model               string                    `json:"model"`
	Messages            []rawMessage              `json:"messages"`
	Prompt              json.RawMessage           `json:"prompt"`
	Text                json.RawMessage           `json:"text"`
	InputIDs            json.RawMessage           `json:"input_ids"`
	MaxTokens           *int                      `json:"max_tokens"`
	MaxCompletionTokens *int                      `json:"max_completion_tokens"`
	N                   *int                      `json:"n"`
	SamplingParams      json.RawMessage           `json:"sampling_params"`
	Stream              *bool                     `json:"stream"`
	StreamOptions       *streamOptions            `json:"stream_options"`
	ReturnLogprob       json.RawMessage           `json:"return_logprob"`
	BootstrapHost       json.RawMessage           `json:"bootstrap_host"`
	BootstrapPort       json.RawMessage           `json:"bootstrap_port"`
	BootstrapRoom       json.RawMessage           `json:"bootstrap_room"`
	KVTransferParams    *pdproto.KVTransferParams `json:"kv_transfer_params"`
	RID                 json.RawMessage           `json:"rid"`
	Echo                bool                      `json:"echo"`
}

type rawMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

type samplingParams struct {
	MaxNewTokens *int `json:"max_new_tokens"`
	N            *int `json:"n"`
}

// bootstrap is one SGLang bootstrap triple.
type bootstrap struct {
	host string
	port int
	room uint64
}

// genRequest is a parsed generation request.
type genRequest struct {
	route       route
	model       string
	prompts     [][]int
	batch       bool // the prompt was a list: answer a list
	maxTokens   int
	explicitMax bool // the client set the limit: finish_reason "length"
	stream      bool
	// streaming: the 200 and the SSE headers are out, so anything that
	// goes wrong from here on is an event in the stream.
	streaming bool
	// echo holds each prompt's text when /v1/completions asked for echo:
	// the answer's text starts with it.
	echo         []string
	includeUsage bool
	logprob      bool
	bootstrap    []bootstrap // one per prompt, or none
	kv           *pdproto.KVTransferParams
	rid          string
}

// badRequest is a client error naming the offending field.
type badRequest struct {
	field, msg string
}

func (e *badRequest) Error() string {
	if e.field == "" {
		return e.msg
	}
	return e.field + ": " + e.msg
}

func badf(field, format string, args ...any) error {
	return &badRequest{field: field, msg: fmt.Sprintf(format, args...)}
}

// parseRequest reads a generation body for rt.
func parseRequest(rt route, body []byte, cfg *Config) (*genRequest, error) {
	var raw rawRequest
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := dec.Decode(&raw); err != nil {
		return nil, badf("", "invalid JSON body: %v", err)
	}
	q := &genRequest{route: rt, model: raw.Model, kv: raw.KVTransferParams}
	if q.model == "" {
		q.model = cfg.Model
	}
	if raw.Stream != nil {
		q.stream = *raw.Stream
	}
	if raw.StreamOptions != nil {
		q.includeUsage = raw.StreamOptions.IncludeUsage
	}
	var err error
	if q.rid, err = ridOf(raw.RID); err != nil {
		return nil, err
	}

	var maxTok, n *int
	switch rt {
	case routeChat:
		p, err := chatPrompt(raw.Messages)
		if err != nil {
			return nil, err
		}
		q.prompts = [][]int{p}
		maxTok, n = raw.MaxTokens, raw.N
		if raw.MaxCompletionTokens != nil {
			maxTok = raw.MaxCompletionTokens
		}
	case routeCompletions:
		if q.prompts, q.batch, err = parsePrompts("prompt", raw.Prompt); err != nil {
			return nil, err
		}
		if raw.Echo {
			if q.echo, err = echoTexts(raw.Prompt, q.batch); err != nil {
				return nil, err
			}
		}
		maxTok, n = raw.MaxTokens, raw.N
	case routeGenerate:
		switch {
		case len(raw.Text) > 0 && string(raw.Text) != "null":
			q.prompts, q.batch, err = parsePrompts("text", raw.Text)
		case len(raw.InputIDs) > 0 && string(raw.InputIDs) != "null":
			q.prompts, q.batch, err = parsePrompts("input_ids", raw.InputIDs)
		default:
			err = badf("text", "text or input_ids is required")
		}
		if err != nil {
			return nil, err
		}
		sp, err := parseSamplingParams(raw.SamplingParams)
		if err != nil {
			return nil, err
		}
		maxTok, n = sp.MaxNewTokens, sp.N
		if q.logprob, err = anyTrue("return_logprob", raw.ReturnLogprob); err != nil {
			return nil, err
		}
	}
	if n != nil && *n != 1 {
		return nil, badf("n", "the simulator samples one sequence per prompt, got n=%d", *n)
	}
	q.maxTokens = cfg.MaxTokensDefault
	if maxTok != nil {
		if *maxTok < 1 || *maxTok > cfg.MaxTokensLimit {
			return nil, badf("max_tokens", "must be in [1, %d], got %d", cfg.MaxTokensLimit, *maxTok)
		}
		q.maxTokens, q.explicitMax = *maxTok, true
	}
	for i, p := range q.prompts {
		if len(p) == 0 {
			return nil, badf("prompt", "prompt %d has no tokens", i)
		}
	}
	if q.bootstrap, err = parseBootstrap(&raw, len(q.prompts), q.batch); err != nil {
		return nil, err
	}
	return q, nil
}

// chatPrompt is the prompt of a chat's messages: the simulator's chat
// template writes each message as "role: content" on a line of its own,
// and tokenizes the whole. Every route that takes messages renders them
// here, so that /tokenize's tokens are the chat completion's prompt.
func chatPrompt(msgs []rawMessage) ([]int, error) {
	if len(msgs) == 0 {
		return nil, badf("messages", "at least one message is required")
	}
	var sb strings.Builder
	for i, m := range msgs {
		text, err := messageText(m.Content)
		if err != nil {
			return nil, badf(fmt.Sprintf("messages[%d].content", i), "%v", err)
		}
		sb.WriteString(m.Role)
		sb.WriteString(": ")
		sb.WriteString(text)
		sb.WriteByte('\n')
	}
	return tokenize(sb.String()), nil
}

func ridOf(raw json.RawMessage) (string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var l []string
	if err := json.Unmarshal(raw, &l); err == nil && len(l) > 0 {
		return l[0], nil
	}
	return "", badf("rid", "must be a string or a list of strings")
}

// messageText flattens a chat message's content: a string, or a list of
// parts whose text parts are joined.
func messageText(raw json.RawMessage) (string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", errors.New("must be a string or a list of content parts")
	}
	var sb strings.Builder
	for _, p := range parts {
		if p.Type == "text" {
			sb.WriteString(p.Text)
		}
	}
	return sb.String(), nil
}

// echoTexts returns the text prompts of /v1/completions that asked for
// echo. SGLang's serving_completions (_get_echo_text) and vLLM's
// serving_completion put the prompt in front of the completion; a token-id
// prompt would be detokenized, which the simulator's tokenizer cannot do,
// so it is refused.
func echoTexts(raw json.RawMessage, batch bool) ([]string, error) {
	if !batch {
		var s string
		if err := json.Unmarshal(raw, &s); err == nil {
			return []string{s}, nil
		}
	} else {
		var l []string
		if err := json.Unmarshal(raw, &l); err == nil {
			return l, nil
		}
	}
	return nil, badf("echo", "the simulator echoes text prompts only")
}

// parsePrompts reads a prompt field: a string, a list of token ids, or a
// batch (a list of strings or of token-id lists).
func parsePrompts(field string, raw json.RawMessage) ([][]int, bool, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil, false, badf(field, "is required")
	}
	switch raw[0] {
	case '"':
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, false, badf(field, "%v", err)
		}
		return [][]int{tokenize(s)}, false, nil
	case '[':
	default:
		return nil, false, badf(field, "must be a string, a list of token ids or a batch")
	}
	var elems []json.RawMessage
	if err := json.Unmarshal(raw, &elems); err != nil {
		return nil, false, badf(field, "%v", err)
	}
	if len(elems) == 0 {
		return nil, false, badf(field, "must not be empty")
	}
	first := bytes.TrimSpace(elems[0])
	if len(first) > 0 && first[0] != '"' && first[0] != '[' {
		ids, err := tokenIDs(field, raw)
		if err != nil {
			return nil, false, err
		}
		return [][]int{ids}, false, nil
	}
	out := make([][]int, len(elems))
	for i, e := range elems {
		e = bytes.TrimSpace(e)
		f := fmt.Sprintf("%s[%d]", field, i)
		if len(e) > 0 && e[0] == '"' {
			var s string
			if err := json.Unmarshal(e, &s); err != nil {
				return nil, false, badf(f, "%v", err)
			}
			out[i] = tokenize(s)
			continue
		}
		ids, err := tokenIDs(f, e)
		if err != nil {
			return nil, false, err
		}
		out[i] = ids
	}
	return out, true, nil
}

func tokenIDs(field string, raw json.RawMessage) ([]int, error) {
	var ids []int
	if err := json.Unmarshal(raw, &ids); err != nil {
		return nil, badf(field, "must be a list of token ids: %v", err)
	}
	for i, id := range ids {
		if id < 0 || id > math.MaxInt32 {
			return nil, badf(fmt.Sprintf("%s[%d]", field, i), "token id %d out of range", id)
		}
	}
	if len(ids) == 0 {
		return nil, badf(field, "must not be empty")
	}
	return ids, nil
}

func parseSamplingParams(raw json.RawMessage) (samplingParams, error) {
	var sp samplingParams
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return sp, nil
	}
	if raw[0] == '[' {
		// A batch may carry one object per prompt; the simulator applies
		// the first to all.
		var l []samplingParams
		if err := json.Unmarshal(raw, &l); err != nil {
			return sp, badf("sampling_params", "%v", err)
		}
		if len(l) > 0 {
			sp = l[0]
		}
		return sp, nil
	}
	if err := json.Unmarshal(raw, &sp); err != nil {
		return sp, badf("sampling_params", "%v", err)
	}
	return sp, nil
}

// anyTrue reads a bool or a list of bools and reports whether any is true.
func anyTrue(field string, raw json.RawMessage) (bool, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return false, nil
	}
	var b bool
	if err := json.Unmarshal(raw, &b); err == nil {
		return b, nil
	}
	var l []bool
	if err := json.Unmarshal(raw, &l); err != nil {
		return false, badf(field, "must be a bool or a list of bools")
	}
	for _, v := range l {
		if v {
			return true, nil
		}
	}
	return false, nil
}

// bootstrapField decodes one bootstrap field: a list of the batch's values
// when list, and otherwise one scalar, returned as a list of one.
func bootstrapField[T any](m json.RawMessage, list bool) ([]T, error) {
	if list {
		var vs []T
		err := json.Unmarshal(m, &vs)
		return vs, err
	}
	var v T
	if err := json.Unmarshal(m, &v); err != nil {
		return nil, err
	}
	return []T{v}, nil
}

// parseBootstrap reads the bootstrap triple: scalars for one prompt, lists
// of the batch's length for a batch. Absent is fine (nil); the protocol
// code decides whether it needs one.
func parseBootstrap(raw *rawRequest, n int, batch bool) ([]bootstrap, error) {
	isNull := func(m json.RawMessage) bool { return len(m) == 0 || string(bytes.TrimSpace(m)) == "null" }
	if isNull(raw.BootstrapHost) && isNull(raw.BootstrapRoom) {
		return nil, nil
	}
	if isNull(raw.BootstrapHost) || isNull(raw.BootstrapRoom) {
		return nil, badf("bootstrap_host", "bootstrap_host and bootstrap_room go together")
	}
	list := bytes.TrimSpace(raw.BootstrapHost)[0] == '['
	if list != batch {
		if batch {
			return nil, badf("bootstrap_room", "a batch of %d needs bootstrap lists of %d", n, n)
		}
		return nil, badf("bootstrap_room", "a single prompt needs scalar bootstrap fields")
	}
	hosts, err := bootstrapField[string](raw.BootstrapHost, list)
	if err != nil {
		return nil, badf("bootstrap_host", "%v", err)
	}
	rooms, err := bootstrapField[uint64](raw.BootstrapRoom, list)
	if err != nil {
		return nil, badf("bootstrap_room", "must be an integer in [0, 2^63): %v", err)
	}
	var ports []*int // nil: every entry on the default port
	if !isNull(raw.BootstrapPort) {
		if ports, err = bootstrapField[*int](raw.BootstrapPort, list); err != nil {
			return nil, badf("bootstrap_port", "%v", err)
		}
	}
	if len(hosts) != n || len(rooms) != n || (ports != nil && len(ports) != n) {
		return nil, badf("bootstrap_room", "want %d bootstrap entries, got %d hosts, %d ports, %d rooms", n, len(hosts), len(ports), len(rooms))
	}
	out := make([]bootstrap, n)
	seen := make(map[uint64]bool, n)
	for i := range out {
		if rooms[i] > math.MaxInt64 {
			return nil, badf("bootstrap_room", "%d is not in [0, 2^63)", rooms[i])
		}
		if seen[rooms[i]] {
			return nil, badf("bootstrap_room", "room %d appears twice", rooms[i])
		}
		seen[rooms[i]] = true
		h := strings.TrimSuffix(strings.TrimPrefix(hosts[i], "["), "]")
		if h == "" {
			return nil, badf("bootstrap_host", "must not be empty")
		}
		port := registry.DefaultBootstrapPort
		if ports != nil && ports[i] != nil {
			port = *ports[i]
		}
		if port < 1 || port > 65535 {
			return nil, badf("bootstrap_port", "%d is not a port", port)
		}
		out[i] = bootstrap{host: h, port: port, room: rooms[i]}
	}
	return out, nil
}
