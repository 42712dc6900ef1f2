package router

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
)

// TestLazySeries: the kept series count where WithLabelValues would, a
// series appears only once used, and values outside the fixed sets still
// count.
func TestLazySeries(t *testing.T) {
	m, err := newMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	if n := testutil.CollectAndCount(m.requests) + testutil.CollectAndCount(m.prefillDuration) + testutil.CollectAndCount(m.ttft); n != 0 {
		t.Fatalf("%d series before any request, want none", n)
	}
	m.countRequest(routeChat, outcomeOK)
	m.countRequest(routeChat, outcomeOK)
	m.countRequest(routeGenerate, outcomeClientGone)
	m.countRequest(routeChat, "an outcome of the future")
	m.prefillSeries("sglang", "ok").Observe(0.5)
	m.prefillSeries("sglang", "ok").Observe(0.25)
	m.decodeSeries("vllm", "error").Observe(1)
	m.decodeSeries("trtllm", "ok").Observe(1)
	var s modelSeries
	s.ttftOf(m, routeCompletions, "m1").Observe(0.1)
	s.ttftOf(m, routeCompletions, "m1").Observe(0.2)
	s.promptOf(m, routeCompletions, "m1").Add(7)

	for _, c := range []struct {
		got, want float64
		what      string
	}{
		{testutil.ToFloat64(m.requests.WithLabelValues(routeChat.label(), outcomeOK)), 2, "chat ok"},
		{testutil.ToFloat64(m.requests.WithLabelValues(routeGenerate.label(), outcomeClientGone)), 1, "generate client_gone"},
		{testutil.ToFloat64(m.requests.WithLabelValues(routeChat.label(), "an outcome of the future")), 1, "an unknown outcome"},
		{testutil.ToFloat64(m.promptTokens.WithLabelValues(routeCompletions.label(), "m1")), 7, "prompt tokens"},
	} {
		if c.got != c.want {
			t.Errorf("%s: %v, want %v", c.what, c.got, c.want)
		}
	}
	if n := testutil.CollectAndCount(m.requests); n != 3 {
		t.Errorf("%d request series, want 3", n)
	}
	if n := testutil.CollectAndCount(m.prefillDuration); n != 1 {
		t.Errorf("%d prefill series, want 1", n)
	}
	if n := testutil.CollectAndCount(m.decodeDuration); n != 2 {
		t.Errorf("%d decode series, want 2", n)
	}
	if n := testutil.CollectAndCount(m.ttft); n != 1 {
		t.Errorf("%d ttft series, want 1", n)
	}
	if n := testutil.CollectAndCount(m.completionTokens); n != 0 {
		t.Errorf("%d completion series, want none (never used)", n)
	}
	for _, h := range []struct {
		o     prometheus.Observer
		count uint64
		what  string
	}{
		{m.prefillDuration.WithLabelValues("sglang", "ok"), 2, "sglang prefill ok"},
		{m.decodeDuration.WithLabelValues("vllm", "error"), 1, "vllm decode error"},
		{m.decodeDuration.WithLabelValues("trtllm", "ok"), 1, "an unknown protocol"},
		{m.ttft.WithLabelValues(routeCompletions.label(), "m1"), 2, "ttft"},
	} {
		var d dto.Metric
		if err := h.o.(prometheus.Metric).Write(&d); err != nil {
			t.Fatal(err)
		}
		if got := d.GetHistogram().GetSampleCount(); got != h.count {
			t.Errorf("%s: %d observations, want %d", h.what, got, h.count)
		}
	}
}
