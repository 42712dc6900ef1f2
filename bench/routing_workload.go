package bench

import (
	"cmp"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"
)

// Workloads the routing benchmark generates.
const (
	// WorkloadPrefixHeavy is multi-turn conversations over a few shared
	// system prompts: most of every prompt is a prefix some earlier
	// request sent.
	WorkloadPrefixHeavy = "prefix-heavy"
	// WorkloadNoShared is the same requests' lengths with every prompt
	// fresh random text: nothing for a cache to find.
	WorkloadNoShared = "no-shared"
)

// Span is an inclusive range of integers drawn uniformly.
type Span struct{ Min, Max int }

func (s Span) draw(r *rand.Rand) int { return s.Min + r.IntN(s.Max-s.Min+1) }

func (s Span) String() string { return fmt.Sprintf("%d–%d", s.Min, s.Max) }

// WorkloadSpec shapes a generated workload. The same spec and seed give
// the same requests, byte for byte, in the same order.
type WorkloadSpec struct {
	Kind     string // WorkloadPrefixHeavy or WorkloadNoShared
	Seed     uint64
	Requests int
	// SystemPrompts is how many system prompts the conversations share;
	// default 8.
	SystemPrompts int
	// SystemTokens is a system prompt's length; default 1,500–3,000.
	SystemTokens Span
	// UserTokens is a user message's length; default 50–200.
	UserTokens Span
	// AnswerTokens is an assistant turn's length in the history the next
	// turn re-sends (the sims' answers are synthetic, so the history's
	// answers are the workload's own text); default 20–80.
	AnswerTokens Span
	// Turns is a conversation's number of turns; default 2–6.
	Turns Span
	// Open is how many conversations are under way at once: each request
	// is the next turn of one of them, drawn at random; default 16.
	Open int
	// ZipfS is the exponent of the system prompts' popularity (rank k is
	// drawn in proportion to (1+k)^-s); default 1.1.
	ZipfS float64
}

// WithDefaults returns the spec with unset fields filled in.
func (s WorkloadSpec) WithDefaults() WorkloadSpec {
	s.Kind = cmp.Or(s.Kind, WorkloadPrefixHeavy)
	s.SystemPrompts = cmp.Or(s.SystemPrompts, 8)
	s.SystemTokens = cmp.Or(s.SystemTokens, Span{1500, 3000})
	s.UserTokens = cmp.Or(s.UserTokens, Span{50, 200})
	s.AnswerTokens = cmp.Or(s.AnswerTokens, Span{20, 80})
	s.Turns = cmp.Or(s.Turns, Span{2, 6})
	s.Open = cmp.Or(s.Open, 16)
	s.ZipfS = cmp.Or(s.ZipfS, 1.1)
	return s
}

func (s WorkloadSpec) validate() error {
	for _, sp := range []struct {
		name string
		s    Span
	}{{"system_tokens", s.SystemTokens}, {"user_tokens", s.UserTokens}, {"answer_tokens", s.AnswerTokens}, {"turns", s.Turns}} {
		if sp.s.Min < 1 || sp.s.Max < sp.s.Min {
			return fmt.Errorf("workload spec: %s: want 1 ≤ min ≤ max, got %v", sp.name, sp.s)
		}
	}
	switch {
	case s.Kind != WorkloadPrefixHeavy && s.Kind != WorkloadNoShared:
		return fmt.Errorf("workload spec: kind: %s or %s, got %q", WorkloadPrefixHeavy, WorkloadNoShared, s.Kind)
	case s.Requests < 1:
		return fmt.Errorf("workload spec: requests: at least 1, got %d", s.Requests)
	case s.SystemPrompts < 1:
		return fmt.Errorf("workload spec: system_prompts: at least 1, got %d", s.SystemPrompts)
	case s.Open < 1:
		return fmt.Errorf("workload spec: open: at least 1, got %d", s.Open)
	case s.ZipfS <= 1:
		return fmt.Errorf("workload spec: zipf_s: above 1, got %v", s.ZipfS)
	}
	return nil
}

// WorkloadRequest is one request of a workload.
type WorkloadRequest struct {
	// Conversation numbers the request's conversation; its turns are sent
	// in order, each after the previous one's answer.
	Conversation int
	Turn         int // from 0
	// System is the index of the system prompt the prompt starts with,
	// -1 for none.
	System int
	// Prompt is the conversation so far rendered as one prompt: the
	// system prompt, each earlier turn's user message and answer, and this
	// turn's user message.
	Prompt string
	// Tokens is the prompt's length in the simulator's tokens.
	Tokens int
}

// Workload is a generated workload.
type Workload struct {
	Spec     WorkloadSpec
	Requests []WorkloadRequest
	// SystemTokens is each system prompt's length in tokens (prefix-heavy).
	SystemTokens []int
	// Conversations is how many conversations the requests belong to.
	// Their numbers (WorkloadRequest.Conversation) may have gaps.
	Conversations int
}

// The seeds' second words, so that each part of a workload draws from a
// stream of its own: a conversation's text does not depend on which other
// conversations were drawn before it, and the arrivals not on the text.
const (
	streamInterleave   = 1
	streamArrivals     = 2
	streamSystem       = 1 << 32
	streamConversation = 2 << 32
	streamFresh        = 3 << 32
)

func newRand(seed, stream uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, stream)) }

// GenerateWorkload generates the workload of spec (with defaults).
func GenerateWorkload(spec WorkloadSpec) (*Workload, error) {
	spec = spec.WithDefaults()
	if err := spec.validate(); err != nil {
		return nil, err
	}
	w := prefixHeavy(spec)
	if spec.Kind == WorkloadNoShared {
		// The same lengths, in the same order, of fresh text.
		for i := range w.Requests {
			q := &w.Requests[i]
			r := newRand(spec.Seed, streamFresh+uint64(i))
			q.Prompt, q.Tokens = text(r, q.Tokens-1)
			q.Tokens++ // the BOS token
			q.Conversation, q.Turn, q.System = i, 0, -1
		}
		w.Conversations, w.SystemTokens = len(w.Requests), nil
	}
	return w, nil
}

// conversation is a prefix-heavy conversation under way.
type conversation struct {
	id, system int
	turns      int
	next       int             // the next turn to send
	history    strings.Builder // the prompt so far, up to the next user message
	r          *rand.Rand
}

func prefixHeavy(spec WorkloadSpec) *Workload {
	w := &Workload{Spec: spec, Requests: make([]WorkloadRequest, 0, spec.Requests)}
	systems := make([]string, spec.SystemPrompts)
	for i := range systems {
		r := newRand(spec.Seed, streamSystem+uint64(i))
		body, _ := text(r, spec.SystemTokens.draw(r)-3)
		systems[i] = fmt.Sprintf("System %d: %s", i, body)
		w.SystemTokens = append(w.SystemTokens, simTokens(systems[i]))
	}
	pick := newRand(spec.Seed, streamInterleave)
	var open []*conversation
	for len(w.Requests) < spec.Requests {
		for len(open) < spec.Open {
			c := &conversation{id: w.Conversations, r: newRand(spec.Seed, streamConversation+uint64(w.Conversations))}
			w.Conversations++
			c.system = int(rand.NewZipf(c.r, spec.ZipfS, 1, uint64(spec.SystemPrompts-1)).Uint64())
			c.turns = spec.Turns.draw(c.r)
			c.history.WriteString(systems[c.system])
			open = append(open, c)
		}
		i := pick.IntN(len(open))
		c := open[i]
		user, _ := text(c.r, spec.UserTokens.draw(c.r))
		// Each turn's prompt is the previous one's with the answer and a
		// new message appended after white space: its tokens are the
		// previous prompt's tokens and more.
		c.history.WriteString("\n\nUser: " + user + "\n\nAssistant:")
		prompt := c.history.String()
		w.Requests = append(w.Requests, WorkloadRequest{Conversation: c.id, Turn: c.next, System: c.system,
			Prompt: prompt, Tokens: simTokens(prompt)})
		answer, _ := text(c.r, spec.AnswerTokens.draw(c.r))
		c.history.WriteString(" " + answer)
		if c.next++; c.next == c.turns {
			open = append(open[:i], open[i+1:]...)
		}
	}
	// Conversations opened but never drawn before the end do not count.
	for _, c := range open {
		if c.next == 0 {
			w.Conversations--
		}
	}
	return w
}

// vocabulary is what the workload's text is made of: words of one to three
// of the simulator's tokens.
var vocabulary = strings.Fields(`the a of to and in is it you that he was for on are with as his they be at one
have this from or had by hot word but what some we can out other were all there when up use your how said an each
she which do their time if will way about many then them write would like so these her long make thing see him two
has look more day could go come did number sound no most people my over know water than call first who may down
side been now find any new work part take get place made live where after back little only round man year came show
every good me give our under name very through just form sentence great think say help low line differ turn cause
much mean before move right boy old too same tell does set three want air well also play small end put home read
hand port large spell add even land here must big high such follow act why ask men change went light kind off need
house picture try us again animal point mother world near build self earth father head stand own page should country
found answer school grow study still learn plant cover food sun four between state keep eye never last let thought
city tree cross farm hard start might story saw far sea draw left late run while press close night real life few
north open seem together next white children begin got walk example ease paper group always music those both mark
often letter until mile river car feet care second book carry took science eat room friend began idea fish mountain
stop once base hear horse cut sure watch color face wood main enough plain girl usual young ready above ever red list
though feel talk bird soon body dog family direct pose leave song measure door product black short numeral class wind
question happen complete ship area half rock order fire south problem piece told knew pass since top whole king space
heard best hour better during hundred five remember step early hold west ground interest reach fast verb sing listen
six table travel less morning simple several vowel toward war lay against pattern slow center love person money serve
appear road map rain rule govern pull cold notice voice unit power town fine certain fly fall lead cry dark machine`)

// text draws words until they make at least tokens of the simulator's
// tokens, and returns the words and their count of tokens.
func text(r *rand.Rand, tokens int) (string, int) {
	var b strings.Builder
	n := 0
	for n < tokens {
		w := vocabulary[r.IntN(len(vocabulary))]
		if b.Len() > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(w)
		n += (len(w) + 3) / 4
	}
	return b.String(), n
}

// simTokens is how many tokens `pdplane sim` makes of prompt: a BOS token,
// then each white-space separated word in chunks of four bytes
// (sim/tokenizer.go).
func simTokens(prompt string) int {
	n := 1
	for _, w := range strings.Fields(prompt) {
		n += (len(w) + 3) / 4
	}
	return n
}

// MeanTokens is the mean prompt length in tokens.
func (w *Workload) MeanTokens() float64 {
	sum := 0
	for _, q := range w.Requests {
		sum += q.Tokens
	}
	return float64(sum) / float64(len(w.Requests))
}

// DistinctTokens is how many of the prompts' tokens a cache that never
// evicted would hold at the end: every system prompt sent, once, and every
// conversation's longest prompt past its system prompt.
func (w *Workload) DistinctTokens() (total, systems int) {
	longest := map[int]WorkloadRequest{}
	for _, q := range w.Requests {
		if q.Tokens > longest[q.Conversation].Tokens {
			longest[q.Conversation] = q
		}
	}
	used := map[int]bool{}
	for _, q := range longest {
		total += q.Tokens
		if q.System >= 0 {
			total -= w.SystemTokens[q.System]
			used[q.System] = true
		}
	}
	for s := range used {
		systems += w.SystemTokens[s]
	}
	return total + systems, systems
}

// Arrivals is the workload's send times from its start: a Poisson process
// of rate requests a second, drawn from the seed.
func (w *Workload) Arrivals(rate float64) []time.Duration {
	r := newRand(w.Spec.Seed, streamArrivals)
	out := make([]time.Duration, len(w.Requests))
	t := 0.0
	for i := range out {
		t += r.ExpFloat64() / rate
		out[i] = time.Duration(t * float64(time.Second))
	}
	return out
}
