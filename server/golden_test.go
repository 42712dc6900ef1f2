package server_test

import (
	"bytes"
	"encoding/json"
	"flag"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/registry/registrytest"
	"github.com/pdplane/pdplane/sim/simtest"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata/")

var (
	uuidRE = regexp.MustCompile(`[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}`)
	timeRE = regexp.MustCompile(`"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z"`)
	idRE   = regexp.MustCompile(`"(id|next_cursor)":\d+`)
)

// normalize replaces what changes from run to run (IDs, times, event IDs)
// and indents, so the golden files show only the wire shape and values.
func normalize(t *testing.T, body []byte) []byte {
	t.Helper()
	body = uuidRE.ReplaceAll(body, []byte("<uuid>"))
	body = timeRE.ReplaceAll(body, []byte(`"<time>"`))
	body = idRE.ReplaceAll(body, []byte(`"$1":0`))
	var out bytes.Buffer
	if err := json.Indent(&out, body, "", "  "); err != nil {
		t.Fatalf("answer is not JSON: %v\n%s", err, body)
	}
	out.WriteByte('\n')
	return out.Bytes()
}

// TestGoldenAnswers pins the JSON the API answers with. Run with -update
// after an intended change to the contract and review the diff.
func TestGoldenAnswers(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.checkGolden(t, b.goldenCases(t))
}

// TestGoldenPublished pins how peers registered from what stock engines
// publish look: unknown fields absent and listed, and their pair routable
// but unverified, naming what could not be checked.
func TestGoldenPublished(t *testing.T) {
	t.Parallel()
	b := setup(t)
	pf := b.register(t, registrytest.PublishedSpec("p0", registry.RolePrefill))
	dv := b.register(t, registrytest.PublishedSpec("d0", registry.RoleDecode))
	b.heartbeat(t, pf["id"].(string), "inst-p0")
	b.heartbeat(t, dv["id"].(string), "inst-d0")
	simtest.WaitFor(t, "a routable pair", func() bool { ok, _ := b.mirror.Snapshot().Routable(); return ok })
	b.checkGolden(t, []goldenCase{
		{"published-peer", "GET", "/api/v1/peers/" + dv["id"].(string), "", "", http.StatusOK},
		{"published-pairs", "GET", "/api/v1/pairs", "", "", http.StatusOK},
	})
}

type goldenCase struct {
	name, method, path, token, body string
	status                          int // the status the answer must carry
}

func (b *bundle) goldenCases(t *testing.T) []goldenCase {
	pf := b.register(t, registrytest.Spec("p0", registry.RolePrefill))
	dv := b.register(t, registrytest.Spec("d0", registry.RoleDecode))
	b.heartbeat(t, pf["id"].(string), "inst-p0")
	b.heartbeat(t, dv["id"].(string), "inst-d0")
	simtest.WaitFor(t, "a routable pair", func() bool { ok, _ := b.mirror.Snapshot().Routable(); return ok })
	bad := strings.Replace(string(specJSON(registrytest.Spec("x", registry.RoleDecode))), `"VRAM","VRAM"`, `"VRAM","HBM"`, 1)

	return []goldenCase{
		{"peer", "GET", "/api/v1/peers/" + dv["id"].(string), "", "", http.StatusOK},
		{"pairs", "GET", "/api/v1/pairs", "", "", http.StatusOK},
		{"events", "GET", "/api/v1/events?limit=3", "", "", http.StatusOK},
		{"registration", "GET", "/api/v1/peers/" + dv["id"].(string) + "/registration", adminToken, "", http.StatusOK},
		{"heartbeat", "POST", "/api/v1/peers/" + dv["id"].(string) + "/heartbeat", b.cred(dv["id"].(string)), `{"instance_id":"inst-d0","load":{"running":1,"queued":0,"kv_usage":0.5}}`, http.StatusOK},
		{"problem-unknown-kind", "POST", "/api/v1/peers", joinToken, bad, http.StatusUnprocessableEntity},
		{"problem-unauthorized", "DELETE", "/api/v1/peers/" + dv["id"].(string), "", "", http.StatusUnauthorized},
		{"problem-forbidden", "DELETE", "/api/v1/peers/" + dv["id"].(string), joinToken, "", http.StatusForbidden},
	}
}

// checkGolden sends each case, checks its status and content type, and
// compares the normalized answer with its golden file, or rewrites the file
// under -update.
func (b *bundle) checkGolden(t *testing.T, cases []goldenCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequest(tc.method, b.url+tc.path, strings.NewReader(tc.body))
			if tc.body != "" {
				req.Header.Set("Content-Type", "application/json")
			}
			if tc.token != "" {
				req.Header.Set("Authorization", "Bearer "+tc.token)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tc.status {
				t.Errorf("%s %s: HTTP %d, want %d", tc.method, tc.path, resp.StatusCode, tc.status)
			}
			wantType := "application/json"
			if tc.status >= 400 {
				wantType = "application/problem+json"
			}
			if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, wantType) {
				t.Errorf("%s %s: Content-Type %q, want %s", tc.method, tc.path, ct, wantType)
			}
			got := normalize(t, body)
			path := filepath.Join("testdata", tc.name+".golden.json")
			if *update {
				if err := os.WriteFile(path, got, 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run with -update to create it)", err)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("%s %s answered differently from %s (run with -update if intended):\n%s", tc.method, tc.path, path, got)
			}
		})
	}
}
