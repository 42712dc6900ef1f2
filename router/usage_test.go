package router

import "testing"

// feedSplit feeds body to a fresh tap in pieces of at most size bytes.
func feedSplit(stream bool, body string, size int) usageTap {
	u := usageTap{stream: stream}
	b := []byte(body)
	for len(b) > 0 {
		n := min(size, len(b))
		// A fresh slice per write, as a relay buffer reused between
		// writes would be.
		u.feed(append([]byte(nil), b[:n]...))
		b = b[n:]
	}
	return u
}

func TestUsageTap(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name               string
		stream             bool
		body               string
		prompt, completion int64
		seen               bool
	}{
		{name: "openai answer", body: `{"id":"x","choices":[{"text":"hello"}],"usage":{"prompt_tokens":12,"completion_tokens":3,"total_tokens":15,"prompt_tokens_details":{"cached_tokens":4}}}`,
			prompt: 12, completion: 3, seen: true},
		{name: "pretty printed", body: "{\n  \"usage\": {\n    \"prompt_tokens\" : 7,\n    \"completion_tokens\":\t9\n  }\n}",
			prompt: 7, completion: 9, seen: true},
		{name: "generate batch sums", body: `[{"text":"a","meta_info":{"id":"1","prompt_tokens":5,"completion_tokens":2,"cached_tokens":0}},{"text":"b","meta_info":{"id":"2","prompt_tokens":6,"completion_tokens":3}}]`,
			prompt: 11, completion: 5, seen: true},
		{name: "no usage", body: `{"choices":[{"text":"x"}],"usage":null}`},
		{name: "forged in text", body: `{"choices":[{"text":"\"prompt_tokens\":999,\"completion_tokens\":999"}],"usage":{"prompt_tokens":1,"completion_tokens":2}}`,
			prompt: 1, completion: 2, seen: true},
		{name: "key ending in the name", body: `{"x\"prompt_tokens":99,"usage":{"prompt_tokens":1,"completion_tokens":2}}`,
			prompt: 1, completion: 2, seen: true},
		{name: "logprob keyed by the token", body: `{"logprobs":{"top_logprobs":[{"prompt_tokens":-0.25,"completion_tokens":0.0}]},"usage":{"prompt_tokens":4,"completion_tokens":1}}`,
			prompt: 4, completion: 1, seen: true},
		{name: "stream without usage", stream: true,
			body: "data: {\"choices\":[{\"text\":\"a\"}],\"usage\":null}\n\ndata: {\"choices\":[{\"text\":\"b\"}]}\n\ndata: [DONE]\n\n"},
		{name: "stream usage chunk", stream: true,
			body:   "data: {\"choices\":[{\"text\":\"a\"}],\"usage\":null}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":30,\"completion_tokens\":8}}\n\ndata: [DONE]\n\n",
			prompt: 30, completion: 8, seen: true},
		{name: "stream cumulative: last wins", stream: true,
			body:   "data: {\"text\":\"a\",\"meta_info\":{\"prompt_tokens\":30,\"completion_tokens\":1}}\n\ndata: {\"text\":\"ab\",\"meta_info\":{\"prompt_tokens\":30,\"completion_tokens\":2}}\n\ndata: {\"text\":\"abc\",\"meta_info\":{\"prompt_tokens\":30,\"completion_tokens\":3}}\n\ndata: [DONE]\n\n",
			prompt: 30, completion: 3, seen: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			// Every size of write, so that members split at every byte.
			for size := 1; size <= len(tc.body); size++ {
				u := feedSplit(tc.stream, tc.body, size)
				if u.prompt != tc.prompt || u.completion != tc.completion || (u.seenP || u.seenC) != tc.seen {
					t.Fatalf("writes of %d bytes: prompt %d completion %d seen %v/%v, want %d %d %v",
						size, u.prompt, u.completion, u.seenP, u.seenC, tc.prompt, tc.completion, tc.seen)
				}
				if len(u.pend) > usageMaxMember {
					t.Fatalf("writes of %d bytes: %d bytes pending", size, len(u.pend))
				}
			}
		})
	}
}

func BenchmarkUsageTap(b *testing.B) {
	chunk := []byte("data: {\"id\":\"cmpl-1\",\"object\":\"text_completion\",\"choices\":[{\"index\":0,\"text\":\" token\",\"finish_reason\":null}],\"usage\":null}\n\n")
	b.SetBytes(int64(len(chunk)))
	u := usageTap{stream: true}
	for b.Loop() {
		u.feed(chunk)
	}
}
