package deploy_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"
)

const dashboardPath = "grafana/pdplane.json"

// dashboardQueries returns every PromQL expression of the dashboard: each
// panel's targets (rows included) and each query variable, by where it is.
func dashboardQueries(t *testing.T) map[string]string {
	t.Helper()
	raw, err := os.ReadFile(dashboardPath)
	if err != nil {
		t.Fatal(err)
	}
	type target struct {
		RefID string `json:"refId"`
		Expr  string `json:"expr"`
	}
	type panel struct {
		Title   string   `json:"title"`
		Type    string   `json:"type"`
		Targets []target `json:"targets"`
		Panels  []panel  `json:"panels"`
	}
	var d struct {
		UID        string  `json:"uid"`
		Panels     []panel `json:"panels"`
		Templating struct {
			List []struct {
				Name  string          `json:"name"`
				Type  string          `json:"type"`
				Query json.RawMessage `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatalf("%s: %v", dashboardPath, err)
	}
	if d.UID == "" {
		t.Errorf("%s has no uid", dashboardPath)
	}
	out := map[string]string{}
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			if p.Type != "row" && len(p.Targets) == 0 {
				t.Errorf("panel %q has no query", p.Title)
			}
			for _, tg := range p.Targets {
				if strings.TrimSpace(tg.Expr) == "" {
					t.Errorf("panel %q target %s has no expr", p.Title, tg.RefID)
				}
				out["panel "+p.Title+" "+tg.RefID] = tg.Expr
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		var q struct {
			Query string `json:"query"`
		}
		if err := json.Unmarshal(v.Query, &q); err != nil {
			var s string
			if err := json.Unmarshal(v.Query, &s); err != nil {
				t.Fatalf("variable %s: query %s", v.Name, v.Query)
			}
			q.Query = s
		}
		// label_values(METRIC, LABEL) names a metric and a label.
		if m := regexp.MustCompile(`^label_values\(\s*([^,]+),\s*\w+\s*\)$`).FindStringSubmatch(q.Query); m != nil {
			out["variable "+v.Name] = m[1]
		} else {
			t.Errorf("variable %s: query %q is not label_values(metric, label)", v.Name, q.Query)
		}
	}
	return out
}

// PromQL words that are not metric names.
var promqlWords = map[string]bool{}

func init() {
	for _, w := range strings.Fields(`
		sum min max avg group stddev stdvar count count_values bottomk topk quantile limitk limit_ratio
		by without on ignoring group_left group_right bool and or unless offset
		abs absent absent_over_time ceil changes clamp clamp_max clamp_min day_of_month day_of_week day_of_year
		days_in_month delta deriv exp floor histogram_avg histogram_count histogram_fraction histogram_quantile
		histogram_stddev histogram_stdvar histogram_sum holt_winters double_exponential_smoothing hour idelta
		increase irate label_join label_replace ln log2 log10 minute month predict_linear rate resets round
		scalar sgn sort sort_desc sort_by_label sort_by_label_desc sqrt time timestamp vector year
		avg_over_time min_over_time max_over_time sum_over_time count_over_time quantile_over_time
		stddev_over_time stdvar_over_time last_over_time present_over_time mad_over_time
		acos acosh asin asinh atan atanh cos cosh sin sinh tan tanh deg rad pi
		inf nan Inf NaN`) {
		promqlWords[w] = true
	}
}

var (
	promString   = regexp.MustCompile(`"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|` + "`[^`]*`")
	promMatchers = regexp.MustCompile(`\{[^{}]*\}`)
	promRange    = regexp.MustCompile(`\[[^\[\]]*\]`)
	promGrouping = regexp.MustCompile(`\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)`)
	grafanaVar   = regexp.MustCompile(`\$\{?\w+\}?`)
	promIdent    = regexp.MustCompile(`[A-Za-z_:][A-Za-z0-9_:]*`)
	// promNumber covers numbers and durations, which the identifier regexp
	// would otherwise split (1e-9, 0x1f, 5m).
	promNumber = regexp.MustCompile(`\b(?:0x[0-9a-fA-F]+|[0-9]+(?:\.[0-9]*)?(?:[eE][-+]?[0-9]+)?(?:ms|s|m|h|d|w|y)?)\b`)
)

// metricNames returns the metric names expr selects: what is left of it
// once strings, label matchers, ranges, grouping clauses, Grafana variables
// and numbers are taken out, minus PromQL's functions and keywords.
func metricNames(expr string) []string {
	s := grafanaVar.ReplaceAllString(expr, " ")
	s = promString.ReplaceAllString(s, `""`)
	s = promMatchers.ReplaceAllString(s, " ")
	s = promRange.ReplaceAllString(s, " ")
	s = promGrouping.ReplaceAllString(s, " ")
	s = promNumber.ReplaceAllString(s, " ")
	var out []string
	for _, id := range promIdent.FindAllString(s, -1) {
		if !promqlWords[id] {
			out = append(out, id)
		}
	}
	return out
}

func TestMetricNamesOfAQuery(t *testing.T) {
	t.Parallel()
	got := metricNames(`histogram_quantile(0.99, sum by (le, protocol) (rate(a_seconds_bucket{result="ok", x=~"by|rate"}[$__rate_interval]))) / ` +
		`on (instance) group_left(version) b_info offset 5m > 1e-9 or vector(0) unless c:recorded:rate5m`)
	if strings.Join(got, " ") != "a_seconds_bucket b_info c:recorded:rate5m" {
		t.Fatalf("metric names %q", got)
	}
}

// scrape is what a /metrics answer exports: its sample names (a
// histogram's are name_bucket, name_sum and name_count; a counter's its
// name, ending in _total).
type scrape struct {
	samples map[string]bool
}

func parseExposition(t *testing.T, body []byte) scrape {
	t.Helper()
	sc := scrape{samples: map[string]bool{}}
	lines := bufio.NewScanner(bytes.NewReader(body))
	lines.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for lines.Scan() {
		line := lines.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if i := strings.IndexAny(line, "{ "); i > 0 {
			sc.samples[line[:i]] = true
		}
	}
	return sc
}

// has says whether the scrape holds a sample named name.
func (sc scrape) has(name string) bool { return sc.samples[name] }

// startDev runs the built binary's `pdplane dev` (serve with simulated
// engines, embedded store) on loopback and returns its base URL once a
// pair is routable.
func startDev(t *testing.T) string {
	t.Helper()
	base, stop := startPdplane(t, "/readyz", func(status int) bool { return status == http.StatusOK }, 60*time.Second,
		"dev", "--prefills", "2", "--decodes", "2", "--prefill-policy", "round_robin", "--log-level", "warn")
	t.Cleanup(stop)
	return base
}

// TestDashboardQueriesNameExportedMetrics: every metric the Grafana
// dashboard queries is one the built binary exports on /metrics. A labelled
// family shows nothing before its first use, so the test drives `pdplane
// dev` through what the dashboard watches first: requests on every route,
// a prefill failing with 500s (retries), a decode whose KV transfers fail
// (stale marks, a heal).
func TestDashboardQueriesNameExportedMetrics(t *testing.T) {
	queries := dashboardQueries(t)
	if len(queries) == 0 {
		t.Fatal("the dashboard has no queries")
	}
	base := startDev(t)
	client := http.Client{Timeout: 10 * time.Second}
	post := func(url, body string) (int, []byte) {
		t.Helper()
		resp, err := client.Post(url, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, b
	}
	scrapeNow := func() ([]byte, scrape) {
		t.Helper()
		resp, err := client.Get(base + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return body, parseExposition(t, body)
	}

	for _, req := range []struct{ path, body string }{
		{"/v1/chat/completions", `{"model":"sim-model","messages":[{"role":"user","content":"hello"}],"max_tokens":4}`},
		{"/v1/completions", `{"model":"sim-model","prompt":"hello","max_tokens":4,"stream":true,"stream_options":{"include_usage":true}}`},
		{"/generate", `{"text":"hello","sampling_params":{"max_new_tokens":4}}`},
	} {
		if code, body := post(base+req.path, req.body); code != http.StatusOK {
			t.Fatalf("POST %s: %d %s", req.path, code, body)
		}
	}

	// Faults, through the simulators' own API.
	resp, err := client.Get(base + "/api/v1/peers")
	if err != nil {
		t.Fatal(err)
	}
	var peers struct {
		Peers []struct{ Name, URL string }
	}
	err = json.NewDecoder(resp.Body).Decode(&peers)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	urls := map[string]string{}
	for _, p := range peers.Peers {
		urls[p.Name] = strings.TrimRight(p.URL, "/")
	}
	setFault := func(name, fault string) {
		t.Helper()
		if urls[name] == "" {
			t.Fatalf("pdplane dev has no peer %s; it lists %+v", name, peers.Peers)
		}
		if code, body := post(urls[name]+"/_sim/fault", `{"fault":"`+fault+`"}`); code != http.StatusOK {
			t.Fatalf("%s: set fault %s: %d %s", name, fault, code, body)
		}
	}
	var body []byte
	var sc scrape
	// until sends requests until the scrape has every series named.
	until := func(what string, series ...string) {
		t.Helper()
		for i := 0; ; i++ {
			post(base+"/v1/chat/completions", `{"model":"sim-model","messages":[{"role":"user","content":"again `+strconv.Itoa(i)+`"}],"max_tokens":2}`)
			body, sc = scrapeNow()
			if !slices.ContainsFunc(series, func(s string) bool { return !sc.has(s) }) {
				return
			}
			if i == 50 {
				t.Fatalf("no %s after %d requests with faults:\n%s", what, i+1, body)
			}
		}
	}
	// decode-0 loses its KV memory kind with both prefills: the first
	// failing pair is quarantined while the other prefill keeps using the
	// decode, the second leaves no prefill for it and the registry marks it
	// stale; the router retries each failed request on decode-1.
	setFault("decode-0", "missing-mem-kind")
	until("retry or stale mark", "pdplane_router_retries_total", "pdplane_router_stale_marks_total")

	for where, expr := range queries {
		names := metricNames(expr)
		if len(names) == 0 {
			t.Errorf("%s: %q names no metric", where, expr)
		}
		for _, n := range names {
			if !sc.has(n) {
				t.Errorf("%s: %q queries %s, which pdplane does not export", where, expr, n)
			}
		}
	}

	// promtool check metrics, when promtool is installed (the same checks
	// run without it in router's TestMetricsLint, through promlint).
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Log("promtool not installed: skipping promtool check metrics")
		return
	}
	cmd := exec.Command(promtool, "check", "metrics")
	cmd.Stdin = bytes.NewReader(body)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("promtool check metrics: %v\n%s", err, out)
	}
	// And each expression parses: promtool check rules, one recording rule
	// per expression, Grafana's variables replaced by plain values.
	var rules strings.Builder
	rules.WriteString("groups:\n- name: dashboard\n  rules:\n")
	keys := make([]string, 0, len(queries))
	for k := range queries {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	subst := strings.NewReplacer("$__rate_interval", "5m", "$__interval", "1m", "$__range", "1h", "$model", ".*", "${model}", ".*")
	for i, k := range keys {
		exprJSON, _ := json.Marshal(subst.Replace(queries[k]))
		rules.WriteString("  - record: dashboard:q" + strconv.Itoa(i) + "\n    expr: " + string(exprJSON) + "\n")
	}
	file := filepath.Join(t.TempDir(), "rules.yml")
	if err := os.WriteFile(file, []byte(rules.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(promtool, "check", "rules", file).CombinedOutput(); err != nil {
		t.Errorf("promtool check rules (the dashboard's expressions): %v\n%s\n%s", err, out, rules.String())
	}
}
