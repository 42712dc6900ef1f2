package router

import (
	"errors"
	"net/http"
	"strconv"
)

// route is one of the generation endpoints the router splits.
type route uint8

const (
	routeChat route = iota
	routeCompletions
	routeGenerate
	numRoutes
)

// path is the route's path on the router and on the engines.
func (r route) path() string {
	switch r {
	case routeChat:
		return "/v1/chat/completions"
	case routeCompletions:
		return "/v1/completions"
	default:
		return "/generate"
	}
}

// label names the route in metrics and logs.
func (r route) label() string {
	switch r {
	case routeChat:
		return "chat_completions"
	case routeCompletions:
		return "completions"
	default:
		return "generate"
	}
}

// Limits on what one request may ask for, so that the bootstrap lists the
// router writes stay bounded.
const (
	maxBatch        = 10000
	maxParallelN    = 1024
	maxBootstrapN   = 100000
	membersPrealloc = 16
)

// request is what the router reads from a client's body: the few fields it
// needs, and where every top-level member lies so that it can splice.
type request struct {
	route   route
	body    []byte
	members []jsonMember

	model       string
	modelGiven  bool
	stream      bool
	n           int // parallel samples (OpenAI n, SGLang sampling_params.n), >= 1
	batch       int // number of prompts of a batch; 0 for a single prompt
	logprob     bool
	prefix      []byte // what cache_aware hashes: the head of the prompt
	hasMaxCompl bool   // max_completion_tokens present (chat)
}

// bootstrapCount is the length of the bootstrap lists for a batch or
// parallel-sampled request, and 0 when scalars do.
//
// SGLang expands a request into batch × n sub-requests and indexes the
// bootstrap lists by sub-request, repeating a list it is given n times
// (GenerateReqInput._normalize_bootstrap_params). A list of batch × n
// distinct rooms therefore gives every sub-request its own room, where a
// list of batch rooms would give the n samples of one prompt the same room.
func (q *request) bootstrapCount() int {
	if q.batch == 0 && q.n <= 1 {
		return 0
	}
	return max(q.batch, 1) * q.n
}

// parseRequest validates a client's body and reads the fields the router
// needs. It returns an *apiError for anything a client must fix.
func parseRequest(rt route, body []byte, prefixBytes int) (*request, *apiError) {
	q := &request{route: rt, body: body, n: 1}
	ms, err := scanTopObject(body, make([]jsonMember, 0, membersPrealloc))
	if err != nil {
		var se *jsonSyntaxError
		if errors.As(err, &se) && se.Msg == "body is not a JSON object" {
			return nil, badRequest("request body must be a JSON object", "", "invalid_request_body")
		}
		return nil, badRequest("request body is not valid JSON: "+err.Error(), "", "invalid_json")
	}
	q.members = ms

	if m := find(ms, "model"); m != nil && !isNull(m.value(body)) {
		s, ok := stringValue(m.value(body))
		if !ok {
			return nil, badRequest("'model' must be a string", "model", "invalid_type")
		}
		q.model, q.modelGiven = s, s != ""
	}
	if m := find(ms, "stream"); m != nil {
		v, ok := boolValue(m.value(body))
		if !ok {
			return nil, badRequest("'stream' must be a boolean", "stream", "invalid_type")
		}
		q.stream = v
	}

	var prompt []byte
	switch rt {
	case routeChat:
		m := find(ms, "messages")
		if m == nil || isNull(m.value(body)) {
			return nil, badRequest("'messages' is a required property", "messages", "missing_required_parameter")
		}
		v := m.value(body)
		if v[0] != '[' {
			return nil, badRequest("'messages' must be an array", "messages", "invalid_type")
		}
		if isEmptyArray(v) {
			return nil, badRequest("'messages' must not be empty", "messages", "invalid_value")
		}
		prompt = v
		if e := q.readN(find(ms, "n"), "n"); e != nil {
			return nil, e
		}
		q.hasMaxCompl = find(ms, "max_completion_tokens") != nil
	case routeCompletions:
		m := find(ms, "prompt")
		if m == nil || isNull(m.value(body)) {
			return nil, badRequest("'prompt' is a required property", "prompt", "missing_required_parameter")
		}
		prompt = m.value(body)
		if e := q.readPrompt(prompt, "prompt", false, "'prompt' must be a string or an array"); e != nil {
			return nil, e
		}
		if e := q.readN(find(ms, "n"), "n"); e != nil {
			return nil, e
		}
	case routeGenerate:
		text, ids := find(ms, "text"), find(ms, "input_ids")
		if text != nil && isNull(text.value(body)) {
			text = nil
		}
		if ids != nil && isNull(ids.value(body)) {
			ids = nil
		}
		switch {
		case text == nil && ids == nil:
			return nil, badRequest("either 'text' or 'input_ids' is required", "text", "missing_required_parameter")
		case text != nil && ids != nil:
			return nil, badRequest("give either 'text' or 'input_ids', not both", "input_ids", "invalid_value")
		case text != nil:
			prompt = text.value(body)
			if e := q.readPrompt(prompt, "text", true, "'text' must be a string or an array of strings"); e != nil {
				return nil, e
			}
		default:
			v := ids.value(body)
			if v[0] != '[' {
				return nil, badRequest("'input_ids' must be an array", "input_ids", "invalid_type")
			}
			b, e := batchOf(v, "input_ids", false)
			if e != nil {
				return nil, e
			}
			q.batch = b
			prompt = v
		}
		if sp := find(ms, "sampling_params"); sp != nil && sp.value(body)[0] == '{' {
			inner, err := scanObjectAt(body, sp.valStart, nil)
			if err == nil {
				if e := q.readN(find(inner, "n"), "sampling_params.n"); e != nil {
					return nil, e
				}
			}
		}
		if m := find(ms, "return_logprob"); m != nil {
			q.logprob = anyTrue(body, m.value(body))
		}
	}
	if q.batch > maxBatch {
		return nil, badRequest("batch of "+strconv.Itoa(q.batch)+" prompts exceeds the limit of "+strconv.Itoa(maxBatch), "", "batch_too_large")
	}
	if q.bootstrapCount() > maxBootstrapN {
		return nil, badRequest("batch size times n exceeds "+strconv.Itoa(maxBootstrapN), "n", "batch_too_large")
	}
	if len(prompt) > prefixBytes {
		prompt = prompt[:prefixBytes]
	}
	q.prefix = prompt
	return q, nil
}

// readN reads a parallel-sample count.
func (q *request) readN(m *jsonMember, param string) *apiError {
	if m == nil {
		return nil
	}
	v := m.value(q.body)
	if isNull(v) {
		return nil
	}
	n, err := strconv.Atoi(string(v))
	if err != nil || n < 1 || n > maxParallelN {
		return badRequest("'"+param+"' must be an integer from 1 to "+strconv.Itoa(maxParallelN), param, "invalid_value")
	}
	q.n = n
	return nil
}

// readPrompt reads v, the value of param, as a string (one prompt) or an
// array (batchOf: a batch, or one tokenized prompt unless stringsOnly); any
// other value is refused with wrongType.
func (q *request) readPrompt(v []byte, param string, stringsOnly bool, wrongType string) *apiError {
	switch v[0] {
	case '"':
	case '[':
		b, e := batchOf(v, param, stringsOnly)
		if e != nil {
			return e
		}
		q.batch = b
	default:
		return badRequest(wrongType, param, "invalid_type")
	}
	return nil
}

// batchOf tells a batch of prompts from a single tokenized prompt: an array
// of strings or of arrays is a batch (its length returned); an array of
// numbers is one prompt (0 returned). stringsOnly refuses arrays of arrays.
func batchOf(v []byte, param string, stringsOnly bool) (int, *apiError) {
	elems, err := arrayElems(v, 0, nil)
	if err != nil {
		return 0, badRequest("'"+param+"' is not a valid array", param, "invalid_type")
	}
	if len(elems) == 0 {
		return 0, badRequest("'"+param+"' must not be empty", param, "invalid_value")
	}
	first := v[elems[0].start]
	switch {
	case first == '"':
	case first == '[' && !stringsOnly:
	case (first == '-' || isDigit(first)) && !stringsOnly:
		return 0, nil
	default:
		return 0, badRequest("'"+param+"' has elements of an unexpected type", param, "invalid_type")
	}
	for _, e := range elems {
		if v[e.start] != first {
			return 0, badRequest("'"+param+"' mixes element types", param, "invalid_type")
		}
	}
	return len(elems), nil
}

func isNull(v []byte) bool { return len(v) == 4 && string(v) == "null" }

func boolValue(v []byte) (bool, bool) {
	switch string(v) {
	case "true":
		return true, true
	case "false", "null":
		return false, true
	}
	return false, false
}

func isEmptyArray(v []byte) bool { return len(v) >= 2 && v[0] == '[' && skipWS(v, 1) == len(v)-1 }

// anyTrue reports whether a value is true or an array holding true (SGLang
// accepts a per-prompt list for return_logprob).
func anyTrue(body, v []byte) bool {
	if string(v) == "true" {
		return true
	}
	if len(v) == 0 || v[0] != '[' {
		return false
	}
	elems, err := arrayElems(v, 0, nil)
	if err != nil {
		return false
	}
	for _, e := range elems {
		if string(v[e.start:e.end]) == "true" {
			return true
		}
	}
	return false
}

// apiError is an error in the OpenAI format, for the client.
type apiError struct {
	Status  int
	Message string
	Type    string
	Param   string
	Code    string
}

func badRequest(msg, param, code string) *apiError {
	return &apiError{Status: http.StatusBadRequest, Message: msg, Type: "invalid_request_error", Param: param, Code: code}
}
