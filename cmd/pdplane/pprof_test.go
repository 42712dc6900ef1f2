package main

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/rs/zerolog"
)

func TestServePprofAddrRefusesNonLoopback(t *testing.T) {
	t.Parallel()
	for _, addr := range []string{"0.0.0.0:6060", ":6060", "10.0.0.5:6060", "localhost"} {
		if hs, err := startPprof(addr, zerolog.Nop()); err == nil {
			_ = hs.Close()
			t.Errorf("startPprof(%q) served; want a refusal", addr)
		} else if !strings.Contains(err.Error(), "--pprof-addr") {
			t.Errorf("startPprof(%q): the error does not name the flag: %v", addr, err)
		}
	}
}

func TestServePprofAddrServesProfiles(t *testing.T) {
	t.Parallel()
	hs, err := startPprof("127.0.0.1:0", zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = hs.Close() })
	resp, err := http.Get("http://" + hs.Addr + "/debug/pprof/goroutine?debug=1")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(string(body), "goroutine profile: total") {
		t.Fatalf("GET goroutine profile: %d %.80q", resp.StatusCode, body)
	}
}
