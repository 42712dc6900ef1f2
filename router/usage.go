package router

import "bytes"

// usageTap reads the token counts an engine reports out of the decode's
// answer as it is relayed, without parsing the answer: it looks for the
// members "prompt_tokens" and "completion_tokens" with an integer value
// (OpenAI's usage object, SGLang's meta_info) in the bytes going to the
// client. JSON escapes every quote inside a string, so a prompt or a
// completion cannot forge such a member; a logprob keyed by a token of that
// spelling has a non-integer value and is skipped.
//
// A whole answer may carry several usage blocks (SGLang's /generate with a
// batch of prompts answers one object per prompt): they are summed. In a
// stream every block is cumulative (vLLM's continuous usage, SGLang's
// meta_info in each /generate chunk, the final usage chunk of
// stream_options.include_usage): the last one wins. A stream without usage
// counts nothing.
type usageTap struct {
	stream             bool
	prompt, completion int64
	seenP, seenC       bool
	// pend holds the tail of the previous write that may begin a member
	// split across writes.
	pend []byte
}

// usageKeyTail is what both members' names end with.
var usageKeyTail = []byte(`_tokens"`)

const (
	usagePromptKey     = `"prompt_tokens"`
	usageCompletionKey = `"completion_tokens"`
	// usageMaxMember bounds one member as the tap reads it: the longer
	// name, a little whitespace, the colon and up to 19 digits.
	usageMaxMember = len(usageCompletionKey) + 8 + 1 + 19 + 1
)

// feed scans b, the next bytes sent to the client.
func (u *usageTap) feed(b []byte) {
	if len(u.pend) > 0 {
		if len(b) < usageMaxMember {
			// A small write: scan it joined to the pending tail.
			w := append(u.pend, b...)
			keep := u.scan(w, len(w))
			u.pend = append(w[:0], w[keep:]...)
			return
		}
		// Members starting in the pending tail end within b's head.
		w := append(u.pend, b[:usageMaxMember]...)
		u.scan(w, len(u.pend))
		u.pend = w[:0]
	}
	keep := u.scan(b, len(b))
	u.pend = append(u.pend[:0], b[keep:]...)
}

// scan records the members of b whose opening quote lies before limit and
// returns where an unfinished member may begin: the tail of b after the
// last member it read, at most usageMaxMember bytes of it.
func (u *usageTap) scan(b []byte, limit int) int {
	keep := max(0, len(b)-usageMaxMember)
	for i := 0; ; {
		j := bytes.Index(b[i:], usageKeyTail)
		if j < 0 {
			return keep
		}
		tail := i + j // the '_' of _tokens"
		i = tail + len(usageKeyTail)
		var prompt bool
		var start int
		switch {
		case tail >= len(`"prompt`) && string(b[tail-len(`"prompt`):tail]) == `"prompt`:
			prompt, start = true, tail-len(`"prompt`)
		case tail >= len(`"completion`) && string(b[tail-len(`"completion`):tail]) == `"completion`:
			start = tail - len(`"completion`)
		default:
			continue
		}
		if start >= limit {
			return keep
		}
		if start > 0 && b[start-1] == '\\' {
			continue // the end of a key that merely ends with the name
		}
		n, end, ok := memberInt(b, i)
		if end < 0 {
			// The member runs past b: it may complete with the next write.
			return max(keep, min(start, len(b)))
		}
		if end > keep {
			keep = min(end, len(b))
		}
		if !ok {
			continue
		}
		u.record(prompt, n)
	}
}

// memberInt reads `: <integer>` at b[i:], the integer ended by a JSON
// delimiter. end is just past the integer, or -1 when b ends first; ok is
// false when the value is not a plain integer.
func memberInt(b []byte, i int) (n int64, end int, ok bool) {
	i = skipWS(b, i)
	if i >= len(b) {
		return 0, -1, false
	}
	if b[i] != ':' {
		return 0, i, false
	}
	i = skipWS(b, i+1)
	digits := 0
	for ; i < len(b) && isDigit(b[i]); i++ {
		if digits++; digits > 18 {
			return 0, i, false
		}
		n = n*10 + int64(b[i]-'0')
	}
	if i >= len(b) {
		return 0, -1, false
	}
	switch b[i] {
	case ',', '}', ']', ' ', '\t', '\r', '\n':
		return n, i, digits > 0
	}
	return 0, i, false
}

func (u *usageTap) record(prompt bool, n int64) {
	switch {
	case prompt && u.stream:
		u.prompt, u.seenP = n, true
	case prompt:
		u.prompt, u.seenP = u.prompt+n, true
	case u.stream:
		u.completion, u.seenC = n, true
	default:
		u.completion, u.seenC = u.completion+n, true
	}
}
