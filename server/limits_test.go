package server

import (
	"maps"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
)

// TestEmbeddedMaxBodyTable pins the body limit of every /api/v1 operation
// that takes a body, as the embedded openapi.yaml declares them.
func TestEmbeddedMaxBodyTable(t *testing.T) {
	got, err := loadRouteMaxBody()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]int64{
		"POST /api/v1/peers":                             24 << 20,
		"PUT /api/v1/peers/{id}/probe":                   3 << 20,
		"POST /api/v1/peers/{id}/stale":                  1 << 20,
		"POST /api/v1/peers/{id}/heartbeat":              256 << 10,
		"PUT /api/v1/pairs/{prefill}/{decode}/preflight": 64 << 10,
	}
	if !maps.Equal(got, want) {
		t.Fatalf("body limits from the embedded spec:\n got %v\nwant %v", got, want)
	}
}

func TestRouteMaxBodyFromRefusesUndeclared(t *testing.T) {
	spec := func(post map[string]any, postBody bool, get map[string]any) *openapi3.T {
		doc := &openapi3.T{Paths: openapi3.NewPaths()}
		op := &openapi3.Operation{Extensions: post}
		if postBody {
			op.RequestBody = &openapi3.RequestBodyRef{Value: openapi3.NewRequestBody()}
		}
		doc.Paths.Set("/api/v1/things", &openapi3.PathItem{Post: op, Get: &openapi3.Operation{Extensions: get}})
		return doc
	}
	declared := map[string]any{maxBodyExtension: float64(4096)}
	if tbl, err := routeMaxBodyFrom(spec(declared, true, nil)); err != nil || tbl["POST /api/v1/things"] != 4096 || len(tbl) != 1 {
		t.Fatalf("declared: %v, %v", tbl, err)
	}
	for name, c := range map[string]struct {
		post     map[string]any
		postBody bool
		get      map[string]any
		want     string
	}{
		"body without a limit": {nil, true, nil, "POST /api/v1/things takes a body but declares no x-pdplane-max-body"},
		"a limit without body": {declared, true, declared, "GET /api/v1/things declares x-pdplane-max-body but takes no body"},
		"zero":                 {map[string]any{maxBodyExtension: float64(0)}, true, nil, "x-pdplane-max-body 0"},
		"not a number":         {map[string]any{maxBodyExtension: "16MiB"}, true, nil, "x-pdplane-max-body 16MiB"},
		"not a whole number":   {map[string]any{maxBodyExtension: 1.5}, true, nil, "x-pdplane-max-body 1.5"},
	} {
		if tbl, err := routeMaxBodyFrom(spec(c.post, c.postBody, c.get)); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: table %v, error %v; want an error naming %q", name, tbl, err, c.want)
		}
	}
}
