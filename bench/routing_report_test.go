package bench

import (
	"bytes"
	"encoding/json"
	"encoding/xml"
	"errors"
	"io"
	"slices"
	"strings"
	"testing"
	"time"
)

// reportFixture is a report of two workloads through three routers, one
// of which was not measured, with a name that needs escaping.
func reportFixture(t *testing.T) *RoutingReport {
	t.Helper()
	rep := &RoutingReport{Config: RoutingConfig{Pdplane: "pdplane", Routers: []Peer{{Name: RouterOracle}}}.WithDefaults()}
	for i, kind := range []string{WorkloadPrefixHeavy, WorkloadNoShared} {
		w := generate(t, WorkloadSpec{Kind: kind, Seed: 1, Requests: 20})
		run := WorkloadRun{Workload: w, Rate: 5, CapacityRPS: 7}
		for j, name := range []string{RouterPdplaneRing, RouterOracle, `a<b&"c"`} {
			r := RouterResult{Router: name, Engine: "sglang", Policy: routerPolicy(name), Requests: 20, OK: 20, PromptTokens: 1000, CachedTokens: int64(100 * (i + j)),
				Elapsed: 4 * time.Second}
			for k := range 20 {
				r.TTFT = append(r.TTFT, time.Duration(k+1+j*10)*time.Millisecond)
				r.E2E = append(r.E2E, time.Duration(k+5+j*10)*time.Millisecond)
			}
			run.Results = append(run.Results, r)
		}
		run.Results = append(run.Results, RouterResult{Router: RouterPdplane, Err: "serve: unknown policy"})
		rep.Runs = append(rep.Runs, run)
	}
	return rep
}

// TestRoutingPlotIsWellFormedSVG: the SVG parses as XML, and each
// workload has one TTFT curve and one hit-rate bar per measured router.
func TestRoutingPlotIsWellFormedSVG(t *testing.T) {
	t.Parallel()
	rep := reportFixture(t)
	var b bytes.Buffer
	if err := rep.WriteSVG(&b); err != nil {
		t.Fatal(err)
	}
	dec := xml.NewDecoder(&b)
	series := map[string][]string{} // class: data-router of each element
	root := ""
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("the SVG is not well-formed XML: %v", err)
		}
		se, ok := tok.(xml.StartElement)
		if !ok {
			continue
		}
		if root == "" {
			root = se.Name.Space + " " + se.Name.Local
		}
		var class, router string
		for _, a := range se.Attr {
			switch a.Name.Local {
			case "class":
				class = a.Value
			case "data-router":
				router = a.Value
			}
		}
		if router != "" {
			series[class+" "+se.Name.Local] = append(series[class+" "+se.Name.Local], router)
		}
	}
	if root != "http://www.w3.org/2000/svg svg" {
		t.Errorf("root element %q", root)
	}
	want := []string{RouterPdplaneRing, RouterOracle, `a<b&"c"`, RouterPdplaneRing, RouterOracle, `a<b&"c"`}
	for _, k := range []string{"cdf polyline", "hit rect"} {
		if !slices.Equal(series[k], want) {
			t.Errorf("%s series: %q, want %q (one per measured router and workload)", k, series[k], want)
		}
	}
}

// TestRoutingJSONShape: one workload prints {"routers": {name: figures}}
// with exactly the documented fields (and error for a router not
// measured); two are keyed by workload.
func TestRoutingJSONShape(t *testing.T) {
	t.Parallel()
	rep := reportFixture(t)
	one := &RoutingReport{Config: rep.Config, Runs: rep.Runs[:1]}
	var b bytes.Buffer
	if err := one.WriteJSON(&b); err != nil {
		t.Fatal(err)
	}
	var got map[string]map[string]map[string]any
	if err := json.Unmarshal(b.Bytes(), &got); err != nil {
		t.Fatalf("%v\n%s", err, b.String())
	}
	fields := []string{"e2e_p99_ms", "failed", "hit_rate", "prefill_tokens_per_request", "rps", "ttft_p50_ms", "ttft_p99_ms"}
	if len(got) != 1 || len(got["routers"]) != 4 {
		t.Fatalf("want {\"routers\": 4 routers}, got %s", b.String())
	}
	for name, figs := range got["routers"] {
		var keys []string
		for k := range figs {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		want := fields
		if name == RouterPdplane {
			want = []string{"e2e_p99_ms", "error", "failed", "hit_rate", "prefill_tokens_per_request", "rps", "ttft_p50_ms", "ttft_p99_ms"}
		}
		if !slices.Equal(keys, want) {
			t.Errorf("%s: fields %v, want %v", name, keys, want)
		}
	}
	oracle := got["routers"][RouterOracle]
	if oracle["hit_rate"] != 0.1 || oracle["ttft_p50_ms"] != 20.0 || oracle["rps"] != 5.0 || oracle["prefill_tokens_per_request"] != 45.0 {
		t.Errorf("oracle: %v: want hit rate 0.1, TTFT p50 20 ms, 5 req/s, 45 prefill tokens a request", oracle)
	}
	b.Reset()
	if err := rep.WriteJSON(&b); err != nil {
		t.Fatal(err)
	}
	var both struct {
		Workloads map[string]RoutersJSON `json:"workloads"`
	}
	if err := json.Unmarshal(b.Bytes(), &both); err != nil || len(both.Workloads[WorkloadPrefixHeavy].Routers) != 4 ||
		len(both.Workloads[WorkloadNoShared].Routers) != 4 {
		t.Errorf("two workloads: %v\n%s", err, b.String())
	}
	var table bytes.Buffer
	rep.Print(&table)
	for _, row := range []string{"| oracle | SGLang PD | probes every prefill | 10.0 % |", "| pdplane |", "pdplane was not measured: serve: unknown policy"} {
		if !strings.Contains(table.String(), row) {
			t.Errorf("the table lacks %q:\n%s", row, table.String())
		}
	}
}
