package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
)

func TestDefaultHealthURL(t *testing.T) {
	t.Parallel()
	for addr, want := range map[string]string{
		"":               "http://127.0.0.1:8080/healthz",
		"0.0.0.0:9000":   "http://127.0.0.1:9000/healthz",
		":9001":          "http://127.0.0.1:9001/healthz",
		"[::]:9002":      "http://127.0.0.1:9002/healthz",
		"10.0.0.5:9003":  "http://10.0.0.5:9003/healthz",
		"[fd00::1]:9004": "http://[fd00::1]:9004/healthz",
		"bad":            "http://127.0.0.1:8080/healthz",
	} {
		if got := defaultHealthURL(addr); got != want {
			t.Errorf("defaultHealthURL(%q) = %q, want %q", addr, got, want)
		}
	}
}

func TestHealthcheck(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/healthz" {
			http.Error(w, "down", http.StatusServiceUnavailable)
		}
	}))
	defer srv.Close()
	ctx := context.Background()
	if err := runHealthcheck(ctx, []string{"--url", srv.URL + "/healthz"}); err != nil {
		t.Errorf("healthy server: %v", err)
	}
	if err := runHealthcheck(ctx, []string{"--url", srv.URL + "/readyz"}); err == nil {
		t.Error("503 reported healthy")
	}
	srv.Close()
	if err := runHealthcheck(ctx, []string{"--url", srv.URL + "/healthz", "--timeout", "1s"}); err == nil {
		t.Error("closed server reported healthy")
	}
}
