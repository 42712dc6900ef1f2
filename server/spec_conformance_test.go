package server_test

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/url"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/legacy"

	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/registry/memstore"
	"github.com/pdplane/pdplane/registry/registrytest"
)

// specRouter loads openapi.yaml and returns a router over its operations.
func specRouter(t *testing.T) routers.Router {
	t.Helper()
	loader := openapi3.NewLoader()
	doc, err := loader.LoadFromFile("../openapi.yaml")
	if err != nil {
		t.Fatalf("load openapi.yaml: %v", err)
	}
	if err := doc.Validate(loader.Context); err != nil {
		t.Fatalf("openapi.yaml is not a valid OpenAPI document: %v", err)
	}
	r, err := legacy.NewRouter(doc)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// schemaValid reports whether the request is one openapi.yaml allows, and
// why not when it is not.
func schemaValid(t *testing.T, r routers.Router, method, path string, header http.Header, body []byte) (bool, error) {
	t.Helper()
	req, err := http.NewRequest(method, "http://127.0.0.1:8080"+path, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		req.Header[k] = v
	}
	req.Header.Set("Content-Type", "application/json")
	// A JSON Schema string is Unicode text; bytes that are not UTF-8 are no
	// string at all, whatever a validator that reads them as U+FFFD says.
	for k, vs := range req.URL.Query() {
		for _, v := range vs {
			if !utf8.ValidString(v) {
				return false, fmt.Errorf("query parameter %s is not UTF-8", k)
			}
		}
	}
	route, params, err := r.FindRoute(req)
	if err != nil {
		return false, err // no such operation, or a path parameter off its pattern
	}
	err = openapi3filter.ValidateRequest(context.Background(), &openapi3filter.RequestValidationInput{
		Request: req, PathParams: params, Route: route,
		Options: &openapi3filter.Options{AuthenticationFunc: openapi3filter.NoopAuthenticationFunc},
	})
	return err == nil, err
}

// status sends a request and returns its status only; an event stream is
// left as soon as its status arrives.
func status(t *testing.T, base, method, path string, header http.Header, body []byte) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp := adminRequest(t, ctx, base, method, path, header, body)
	resp.Body.Close()
	return resp.StatusCode
}

// conformanceEdits are the registration edits whose rules JSON Schema can
// state; the others (URL syntax, label keys, one field against another)
// TestValidate covers.
var conformanceEdits = specEditsBut("url", "labels", "parallelism.pp_rank", "ranks.kv_data_ptrs")

// TestSpecAndServerAgree sends seeded random requests, each with one field
// at an edge of its limits, and requires that the server accepts exactly
// the requests openapi.yaml allows: a schema-valid request is never a 400 or
// 422, and a schema-invalid one is always refused with a 4xx. Rules that
// JSON Schema cannot state (one field against another, label keys, URL
// syntax) are left out of the mutations; TestValidate covers them.
func TestSpecAndServerAgree(t *testing.T) {
	t.Parallel()
	const seed, iterations, budget = 7, 1500, 45 * time.Second
	router := specRouter(t)
	base, _ := serveStore(t, memstore.New(memstore.Config{}))
	g := parityGen{r: rand.New(rand.NewPCG(seed, seed))}

	// A registered peer to heartbeat and report on.
	known := registrytest.Spec("known", registry.RoleDecode)
	a := sendRaw(t, base, "POST", "/api/v1/peers", nil, rawJSON(asMap(known)))
	if a.Status != http.StatusCreated {
		t.Fatalf("register: %d %v", a.Status, a.Body)
	}
	knownID := a.Body.(map[string]any)["id"].(string)
	ids := []string{knownID, knownID, "6f1c3c55-1111-4222-8333-444455556666", "not-a-uuid", "A\x00"}

	deadline := time.Now().Add(budget)
	n, valid := 0, 0
	for ; n < iterations && time.Now().Before(deadline); n++ {
		var method, path string
		var header http.Header
		var b []byte
		switch g.pick(6) {
		case 0, 1: // a registration with one single-field value at an edge
			m := asMap(registrytest.Spec(fmt.Sprintf("p%d", g.pick(3)), registry.RolePrefill))
			g.editSpec(m, conformanceEdits)
			method, path, b = "POST", "/api/v1/peers", rawJSON(m)
		case 2: // a heartbeat
			hb := map[string]any{"instance_id": known.InstanceID}
			switch g.pick(3) {
			case 0:
				hb["instance_id"] = g.str()
			case 1:
				hb["load"] = map[string]any{"running": g.num(), "queued": 0, "kv_usage": 0.5}
			case 2:
				hb["load"] = map[string]any{"running": 0, "queued": g.num(), "kv_usage": g.float()}
			}
			method, path, b = "POST", "/api/v1/peers/"+url.PathEscape(ids[g.pick(len(ids))])+"/heartbeat", rawJSON(hb)
		case 3: // a stale report; transfer reports name a prefill that exists or not
			rep := map[string]any{"reason": "transfer failed"}
			switch g.pick(4) {
			case 0:
				rep["reason"] = g.str()
			case 1:
				rep["error"] = g.str()
			case 2:
				rep["agent_name"] = g.str()
			case 3:
				rep["prefill_id"] = ids[g.pick(len(ids))]
			}
			method, path, b = "POST", "/api/v1/peers/"+url.PathEscape(ids[g.pick(len(ids))])+"/stale", rawJSON(rep)
		case 4: // an event page
			q := url.Values{}
			switch g.pick(3) {
			case 0:
				q.Set("before", string(g.num()))
			case 1:
				q.Set("limit", string(g.num()))
			case 2:
				q.Set("peer_id", ids[g.pick(len(ids))])
			}
			method, path = "GET", "/api/v1/events?"+q.Encode()
		case 5: // a peer listing, or the event stream from a cursor
			if g.pick(2) == 0 {
				method, path = "GET", "/api/v1/peers?model="+url.QueryEscape(g.str())
			} else {
				header = http.Header{"Last-Event-Id": {[]string{"", "0", "-1", "abc", "5", "9223372036854775808"}[g.pick(6)]}}
				method, path = "GET", "/api/v1/events/stream"
			}
		}
		ok, why := schemaValid(t, router, method, path, header, b)
		got := status(t, base, method, path, header, b)
		switch {
		case ok && (got == http.StatusBadRequest || got == http.StatusUnprocessableEntity || got >= 500):
			t.Fatalf("iteration %d: %s %q %.300q is schema-valid, the server answered %d", n, method, path, b, got)
		case !ok && (got < 400 || got >= 500):
			t.Fatalf("iteration %d: %s %q %.300q is schema-invalid (%v), the server answered %d", n, method, path, b, why, got)
		}
		if ok {
			valid++
		}
	}
	if n < 100 || valid < n/10 || valid > n*9/10 {
		t.Fatalf("%d requests, %d schema-valid: too few, or too one-sided to say anything", n, valid)
	}
	t.Logf("%d random requests (%d schema-valid): the server and openapi.yaml agree on every one", n, valid)
}
