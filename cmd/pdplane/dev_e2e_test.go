//go:build linux

package main

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/pdplane/pdplane/bench"
	"github.com/pdplane/pdplane/sim"
)

// waitOutput waits until the process's output matches re and returns the
// output so far.
func waitOutput(t *testing.T, p *process, re *regexp.Regexp, within time.Duration) string {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		out, _ := os.ReadFile(p.log)
		if re.Match(out) {
			return string(out)
		}
		select {
		case <-p.done:
			t.Fatalf("%s exited before printing %q:\n%s", p.name, re, out)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not print %q within %s:\n%s", p.name, re, within, out)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestDevQuickStart runs `pdplane dev` as a newcomer does: it prints the
// OpenAI base URL and status page of the address it was given and the
// engines it started, and a chat completion sent to that base URL is
// answered by the simulated pair.
func TestDevQuickStart(t *testing.T) {
	t.Parallel()
	addr := bench.FreeAddr(t)
	p := startProcess(t, "dev", "dev", "--addr", addr, "--prefills", "1", "--decodes", "2")
	out := waitOutput(t, p, regexp.MustCompile(`Try: curl`), 30*time.Second)
	base := "http://" + addr
	for _, want := range []string{
		"pdplane dev is running: 1 prefill and 2 decode simulated sglang engines (tcp transfer)",
		"OpenAI base URL: " + base + "/v1\n",
		"Status page:     " + base + "/\n",
		"Try: curl " + base + "/v1/chat/completions",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("dev's banner lacks %q:\n%s", want, out)
		}
	}
	for _, name := range []string{"prefill-0", "decode-0", "decode-1"} {
		if !regexp.MustCompile(`(?m)^    ` + name + ` +http://127\.0\.0\.1:\d+$`).MatchString(out) {
			t.Errorf("dev's banner does not list %s with its URL:\n%s", name, out)
		}
	}
	waitHTTP(t, base+"/readyz", 30*time.Second)
	body, _ := json.Marshal(map[string]any{"model": "sim-model", "max_tokens": 2,
		"messages": []map[string]string{{"role": "user", "content": "hello"}}})
	resp, err := http.Post(base+"/v1/chat/completions", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	var answer struct {
		Choices []struct {
			Message struct{ Content string }
		}
	}
	err = json.NewDecoder(resp.Body).Decode(&answer)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || err != nil || len(answer.Choices) == 0 || answer.Choices[0].Message.Content == "" {
		t.Fatalf("chat completion at the printed base URL: %d %v %+v", resp.StatusCode, err, answer)
	}
	// The router's front served it (not net/http), and the access log
	// counted it by its route and status all the same.
	resp, err = http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if want := `pdplane_api_requests_total{code="200",route="/v1/chat/completions"} 1`; !strings.Contains(string(metrics), want) {
		t.Errorf("metrics lack %s:\n%s", want, metrics)
	}
}

// TestDevAndSimRefuseBadFlags: the checks that stay in cmd/pdplane exit
// non-zero with a message that names the flags.
func TestDevAndSimRefuseBadFlags(t *testing.T) {
	t.Parallel()
	bin := pdplaneBinary(t)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"dev", "--prefills", "0"}, "--prefills and --decodes must be at least 1"},
		{[]string{"sim", "--control-plane", "http://127.0.0.1:1", "--transfer-secret", "0123456789abcdef"},
			"--transfer-secret is for sims without --control-plane"},
	} {
		cmd := exec.Command(bin, tc.args...)
		cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
		out, err := cmd.CombinedOutput()
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 || !strings.Contains(string(out), tc.want) {
			t.Errorf("pdplane %s: %v, output %q; want exit 1 saying %q", strings.Join(tc.args, " "), err, out, tc.want)
		}
	}
}

// TestSimAlone: `pdplane sim` without --control-plane runs the engine with
// no agent, says where it serves, and keeps serving.
func TestSimAlone(t *testing.T) {
	t.Parallel()
	p := startProcess(t, "sim", "sim", "--role", "decode", "--name", "d-alone")
	out := waitOutput(t, p, regexp.MustCompile(`d-alone decode \(sglang\) serving at http://127\.0\.0\.1:\d+\n`), 30*time.Second)
	url := regexp.MustCompile(`serving at (http://\S+)`).FindStringSubmatch(out)[1]
	waitHTTP(t, url+"/health", 10*time.Second)
	select {
	case <-p.done:
		t.Fatal("sim without a control plane exited")
	default:
	}
}

// TestSimGeometryFlags: `pdplane sim`'s KV geometry flags reach what its
// agent registers, with the pool sized by them (2 regions of 512 pages of
// 8 tokens × 1 head × 16 × 2 bytes), and the GC and pprof flags parse.
func TestSimGeometryFlags(t *testing.T) {
	t.Parallel()
	addr := bench.FreeAddr(t)
	base := "http://" + addr
	startProcess(t, "serve", "serve", "--addr", addr)
	waitHTTP(t, base+"/healthz", 30*time.Second)
	startProcess(t, "decode", "sim", "--role", "decode", "--name", "d-geom", "--control-plane", base,
		"--page-size", "8", "--num-layers", "1", "--num-kv-heads", "1", "--head-dim", "16",
		"--gc-min-heap-mib", "0", "--pprof-addr", bench.FreeAddr(t))
	var peers struct {
		Peers []struct {
			KV struct {
				PageSize   int `json:"page_size"`
				NumLayers  int `json:"num_layers"`
				NumKVHeads int `json:"num_kv_heads"`
				HeadDim    int `json:"head_dim"`
			} `json:"kv"`
			Ranks []struct {
				KVDataLens []int64 `json:"kv_data_lens"`
			} `json:"ranks"`
		} `json:"peers"`
	}
	deadline := time.Now().Add(30 * time.Second)
	for len(peers.Peers) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the sim did not register within 30s")
		}
		time.Sleep(100 * time.Millisecond)
		getJSON(t, base+"/api/v1/peers", &peers)
	}
	p := peers.Peers[0]
	if p.KV.PageSize != 8 || p.KV.NumLayers != 1 || p.KV.NumKVHeads != 1 || p.KV.HeadDim != 16 {
		t.Errorf("registered geometry %+v, want page_size 8, 1 layer, 1 KV head, head_dim 16", p.KV)
	}
	regionBytes := int64(sim.DefaultPages * 8 * 1 * 16 * 2)
	if len(p.Ranks) != 1 || len(p.Ranks[0].KVDataLens) != 2 || p.Ranks[0].KVDataLens[0] != regionBytes {
		t.Errorf("registered ranks %+v, want one with 2 regions of %d bytes", p.Ranks, regionBytes)
	}
}
