package bench

import (
	"math"
	"reflect"
	"strings"
	"testing"
)

func generate(t *testing.T, spec WorkloadSpec) *Workload {
	t.Helper()
	w, err := GenerateWorkload(spec)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// TestRoutingWorkloadIsDeterministic: a seed gives the same requests, in
// the same order, and the same arrivals; another seed other ones.
func TestRoutingWorkloadIsDeterministic(t *testing.T) {
	t.Parallel()
	for _, kind := range []string{WorkloadPrefixHeavy, WorkloadNoShared} {
		a := generate(t, WorkloadSpec{Kind: kind, Seed: 7, Requests: 300})
		b := generate(t, WorkloadSpec{Kind: kind, Seed: 7, Requests: 300})
		if !reflect.DeepEqual(a, b) || !reflect.DeepEqual(a.Arrivals(5), b.Arrivals(5)) {
			t.Errorf("%s: seed 7 gave two different workloads", kind)
		}
		c := generate(t, WorkloadSpec{Kind: kind, Seed: 8, Requests: 300})
		if a.Requests[0].Prompt == c.Requests[0].Prompt || reflect.DeepEqual(a.Arrivals(5), c.Arrivals(5)) {
			t.Errorf("%s: seeds 7 and 8 gave the same first prompt or arrivals", kind)
		}
		// A shorter run is the longer one's beginning (--duration sizes
		// the run from a sample).
		short := generate(t, WorkloadSpec{Kind: kind, Seed: 7, Requests: 100})
		if !reflect.DeepEqual(short.Requests, a.Requests[:100]) {
			t.Errorf("%s: 100 requests are not the first 100 of 300", kind)
		}
	}
}

// TestRoutingWorkloadPrefixHeavyShares: every turn's prompt is the previous
// turn's prompt with more after it (so its tokens too), every prompt starts
// with its conversation's system prompt, the system prompts are of the
// stated lengths and their popularity falls with their rank, and most of
// the tokens sent were sent before.
func TestRoutingWorkloadPrefixHeavyShares(t *testing.T) {
	t.Parallel()
	spec := WorkloadSpec{Seed: 3, Requests: 2000}.WithDefaults()
	w := generate(t, spec)
	if len(w.Requests) != 2000 || len(w.SystemTokens) != spec.SystemPrompts {
		t.Fatalf("%d requests, %d system prompts", len(w.Requests), len(w.SystemTokens))
	}
	for i, n := range w.SystemTokens {
		if n < spec.SystemTokens.Min || n > spec.SystemTokens.Max+3 {
			t.Errorf("system prompt %d: %d tokens, want %v", i, n, spec.SystemTokens)
		}
	}
	last := map[int]WorkloadRequest{}
	system := map[int]string{} // each system prompt's text, from a first turn
	perSystem := make([]int, spec.SystemPrompts)
	sent := 0
	for i, q := range w.Requests {
		if q.Tokens != simTokens(q.Prompt) {
			t.Fatalf("request %d: %d tokens, the prompt has %d", i, q.Tokens, simTokens(q.Prompt))
		}
		prev, ok := last[q.Conversation]
		switch {
		case !ok && q.Turn != 0:
			t.Fatalf("request %d: conversation %d starts at turn %d", i, q.Conversation, q.Turn)
		case ok && (q.Turn != prev.Turn+1 || q.System != prev.System):
			t.Fatalf("request %d: conversation %d turn %d (system %d) after turn %d (system %d)", i, q.Conversation, q.Turn, q.System, prev.Turn, prev.System)
		case ok && (!strings.HasPrefix(q.Prompt, prev.Prompt) || q.Prompt[len(prev.Prompt)] != ' '):
			t.Fatalf("request %d: turn %d does not extend turn %d's prompt after white space", i, q.Turn, prev.Turn)
		case ok && q.Tokens < prev.Tokens+spec.UserTokens.Min+spec.AnswerTokens.Min:
			t.Fatalf("request %d: turn %d has %d tokens, turn %d had %d: less than an answer and a message more", i, q.Turn, q.Tokens, prev.Turn, prev.Tokens)
		}
		if q.Turn == 0 {
			perSystem[q.System]++
			head := q.Prompt[:strings.Index(q.Prompt, "\n\nUser: ")]
			if s, seen := system[q.System]; seen && s != head {
				t.Fatalf("request %d: system prompt %d differs from an earlier conversation's", i, q.System)
			}
			system[q.System] = head
			if q.Tokens > spec.SystemTokens.Max+3+spec.UserTokens.Max+8 {
				t.Errorf("request %d: a first turn of %d tokens", i, q.Tokens)
			}
		}
		if !strings.HasPrefix(q.Prompt, system[q.System]) {
			t.Fatalf("request %d does not start with system prompt %d", i, q.System)
		}
		last[q.Conversation] = q
		sent += q.Tokens
	}
	if w.Conversations != len(last) {
		t.Errorf("%d conversations counted, %d seen", w.Conversations, len(last))
	}
	if perSystem[0] <= perSystem[spec.SystemPrompts-1] || perSystem[0] < w.Conversations/4 {
		t.Errorf("conversations per system prompt %v: want the first the most popular (Zipf)", perSystem)
	}
	distinct, systems := w.DistinctTokens()
	if share := 1 - float64(distinct)/float64(sent); share < 0.8 {
		t.Errorf("%d of %d tokens sent are distinct: %.2f shared, want most", distinct, sent, share)
	}
	if systems <= 0 || systems > distinct {
		t.Errorf("system prompts' distinct tokens %d of %d", systems, distinct)
	}
}

// TestRoutingWorkloadNoSharedShares: the no-shared workload has the
// prefix-heavy one's lengths, and no two of its prompts share more than
// their first word.
func TestRoutingWorkloadNoSharedShares(t *testing.T) {
	t.Parallel()
	ph := generate(t, WorkloadSpec{Kind: WorkloadPrefixHeavy, Seed: 5, Requests: 500})
	ns := generate(t, WorkloadSpec{Kind: WorkloadNoShared, Seed: 5, Requests: 500})
	firstWords := map[string]int{}
	for i, q := range ns.Requests {
		if d := q.Tokens - ph.Requests[i].Tokens; d < 0 || d > 2 {
			t.Errorf("request %d: %d tokens, the prefix-heavy one %d", i, q.Tokens, ph.Requests[i].Tokens)
		}
		if q.Tokens != simTokens(q.Prompt) || q.System != -1 || q.Turn != 0 {
			t.Fatalf("request %d: %+v", i, q)
		}
		f := strings.Fields(q.Prompt)
		key := strings.Join(f[:3], " ")
		if j, dup := firstWords[key]; dup {
			t.Errorf("requests %d and %d both start %q", j, i, key)
		}
		firstWords[key] = i
	}
	if distinct, _ := ns.DistinctTokens(); distinct != sumTokens(ns) {
		t.Errorf("no-shared: %d distinct tokens of %d", distinct, sumTokens(ns))
	}
}

func sumTokens(w *Workload) int {
	n := 0
	for _, q := range w.Requests {
		n += q.Tokens
	}
	return n
}

// TestRoutingArrivalsArePoisson: the arrivals increase, at the stated
// rate on average, with exponential gaps (their coefficient of variation
// near 1).
func TestRoutingArrivalsArePoisson(t *testing.T) {
	t.Parallel()
	w := generate(t, WorkloadSpec{Seed: 11, Requests: 5000})
	a := w.Arrivals(20)
	var sum, sumSq float64
	for i := range a {
		prev := 0.0
		if i > 0 {
			prev = a[i-1].Seconds()
		}
		gap := a[i].Seconds() - prev
		if gap < 0 {
			t.Fatalf("arrival %d before arrival %d", i, i-1)
		}
		sum += gap
		sumSq += gap * gap
	}
	mean := sum / float64(len(a))
	cv := math.Sqrt(sumSq/float64(len(a))-mean*mean) / mean
	if math.Abs(mean-0.05) > 0.005 || math.Abs(cv-1) > 0.1 {
		t.Errorf("mean gap %.4fs (want 0.05), coefficient of variation %.2f (want 1)", mean, cv)
	}
}
