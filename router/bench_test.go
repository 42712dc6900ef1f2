package router_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/gob"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/router"
	"github.com/pdplane/pdplane/sim"
	"github.com/pdplane/pdplane/sim/simtest"
)

// The P/D benchmarks run simulated engines in a child process (this test
// binary, re-executed with envSims set), so that the benchmark process
// holds only the load generator and the router: comparing its CPU and memory
// with and without the router in the path isolates the router's share.
const (
	envSims        = "PDPLANE_ROUTER_BENCH_SIMS"          // "sglang" or "vllm"
	envSimTokenGap = "PDPLANE_ROUTER_BENCH_SIM_TOKEN_GAP" // the decode's time per token
)

func TestMain(m *testing.M) {
	if proto := os.Getenv(envSims); proto != "" {
		if err := serveSims(registry.Engine(proto)); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		return
	}
	os.Exit(m.Run())
}

// simConfig is a benchmark engine: simtest's small geometry with a pool
// large enough for hundreds of open streams.
func simConfig(name string, role registry.Role, engine registry.Engine) sim.Config {
	c := simtest.Config(name, role, engine)
	c.Pages = 4096
	c.MaxTokensLimit = 1 << 16
	return c
}

// serveSims runs a prefill and a decode sim, writes their registrations to
// stdout (gob), and serves until stdin closes.
func serveSims(engine registry.Engine) error {
	gap, _ := time.ParseDuration(os.Getenv(envSimTokenGap))
	pc := simConfig("p1", registry.RolePrefill, engine)
	dc := simConfig("d1", registry.RoleDecode, engine)
	dc.DecodeTimePerToken = gap
	ctx := context.Background()
	var specs []registry.PeerSpec
	for _, c := range []sim.Config{pc, dc} {
		s, err := sim.New(c, zerolog.Nop())
		if err != nil {
			return err
		}
		defer s.Close()
		if err := s.Start(ctx); err != nil {
			return err
		}
		spec, err := s.Spec(ctx)
		if err != nil {
			return err
		}
		specs = append(specs, spec)
	}
	if err := gob.NewEncoder(os.Stdout).Encode(specs); err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, os.Stdin)
	return nil
}

// startSims starts the simulated engines' process and returns a router
// over them (served over HTTP) and the two registrations.
func startSims(tb testing.TB, engine registry.Engine, tokenGap time.Duration, cfg router.Config) (srv *httptest.Server, prefill, decode registry.PeerSpec) {
	tb.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envSims+"="+string(engine), envSimTokenGap+"="+tokenGap.String())
	stdin, err := cmd.StdinPipe()
	if err != nil {
		tb.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		stdin.Close()
		_ = cmd.Wait()
	})
	var specs []registry.PeerSpec
	if err := gob.NewDecoder(stdout).Decode(&specs); err != nil {
		tb.Fatalf("sims: %v", err)
	}
	reg := newTestRegistry(tb)
	for _, s := range specs {
		reg.register(tb, s)
	}
	rt, err := router.New(cfg, reg.mirror, reg.store, zerolog.Nop(), nil)
	if err != nil {
		tb.Fatal(err)
	}
	srv = httptest.NewServer(rt.Routes())
	tb.Cleanup(func() {
		srv.Close()
		rt.Close()
	})
	return srv, specs[0], specs[1]
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// streamOnce posts body and returns the time to the first SSE data line,
// reading the stream to its end.
func streamOnce(client *http.Client, url string, body []byte) (time.Duration, error) {
	start := time.Now()
	req, _ := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return 0, fmt.Errorf("status %d: %s", resp.StatusCode, b)
	}
	br := bufio.NewReaderSize(resp.Body, 4096)
	var ttft time.Duration
	for {
		line, err := br.ReadSlice('\n')
		if ttft == 0 && bytes.HasPrefix(line, []byte("data:")) {
			ttft = time.Since(start)
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return 0, err
		}
	}
	return ttft, nil
}

func percentile(ds []time.Duration, p float64) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[min(len(s)-1, int(float64(len(s))*p))]
}

// BenchmarkPDRequest compares, in one run, a streamed chat completion sent
// straight to the decode with the same request split by the router into
// prefill and decode legs. It reports the p50/p99 time to the first SSE
// event both ways, the latency the PD split adds (the router, and the
// simulated prefill and KV transfer), and the router's CPU per
// request (the process's CPU with the router minus without, per request).
//
//	go test -run '^$' -bench PDRequest -benchtime 3000x ./router/
func BenchmarkPDRequest(b *testing.B) {
	for _, proto := range []string{"sglang", "vllm"} {
		b.Run(proto, func(b *testing.B) {
			srv, _, dp := startSims(b, registry.Engine(proto), 0, router.Config{})
			client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16, DisableCompression: true}}

			routed := []byte(`{"model":"sim-model","messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"Say hello to the benchmark."}],"stream":true,"max_tokens":8}`)
			// The decode alone: SGLang's fake bootstrap host makes it
			// generate without a prefill (as for its health probes); a vLLM
			// decode without kv_transfer_params computes the prompt itself.
			direct := routed
			if proto == "sglang" {
				direct = append(routed[:len(routed)-1:len(routed)-1], []byte(`,"bootstrap_host":"`+sim.FakeBootstrapHost+`","bootstrap_port":8998,"bootstrap_room":12345}`)...)
			}
			directURL, routerURL := dp.URL+"/v1/chat/completions", srv.URL+"/v1/chat/completions"

			run := func(url string, body []byte, n int) ([]time.Duration, time.Duration) {
				ttfts := make([]time.Duration, 0, n)
				runtime.GC()
				c0 := cpuTime()
				for range n {
					ttft, err := streamOnce(client, url, body)
					if err != nil {
						b.Fatal(err)
					}
					ttfts = append(ttfts, ttft)
				}
				return ttfts, cpuTime() - c0
			}
			n := max(b.N, 100)
			run(directURL, direct, 200) // warm up connections and pools
			run(routerURL, routed, 200)
			b.ResetTimer()
			dT, dCPU := run(directURL, direct, n)
			rT, rCPU := run(routerURL, routed, n)
			b.StopTimer()
			d50, r50 := percentile(dT, 0.5), percentile(rT, 0.5)
			b.ReportMetric(float64(d50.Microseconds()), "direct-ttft-p50-µs")
			b.ReportMetric(float64(r50.Microseconds()), "router-ttft-p50-µs")
			b.ReportMetric(float64((r50 - d50).Microseconds()), "added-ttft-p50-µs")
			b.ReportMetric(float64(percentile(dT, 0.99).Microseconds()), "direct-ttft-p99-µs")
			b.ReportMetric(float64(percentile(rT, 0.99).Microseconds()), "router-ttft-p99-µs")
			b.ReportMetric(float64((rCPU-dCPU).Microseconds())/float64(n), "router-cpu-µs/req")
		})
	}
}

// BenchmarkOpenStreamMemory holds many streams open through the router and
// reports the router's memory per open stream: the process's heap and
// stacks with the streams routed, minus the same number of streams opened
// straight to the decode, per stream. Two paces: a decode generating (a
// token every 20 ms: the stream stays on net/http's connection) and a slow
// one (a token every 300 ms: the router takes the stream's connection
// over, router/takeover.go).
//
//	go test -run '^$' -bench OpenStreamMemory -benchtime 1x ./router/
func BenchmarkOpenStreamMemory(b *testing.B) {
	for _, pace := range []struct {
		name     string
		perToken time.Duration
	}{{"generating", 20 * time.Millisecond}, {"slow", 300 * time.Millisecond}} {
		b.Run(pace.name, func(b *testing.B) { openStreamMemory(b, pace.perToken) })
	}
}

func openStreamMemory(b *testing.B, perToken time.Duration) {
	const streams = 500
	// 60000 tokens: every stream stays open for the whole measurement.
	srv, _, dp := startSims(b, registry.EngineSGLang, perToken, router.Config{})
	routed := []byte(`{"model":"sim-model","messages":[{"role":"user","content":"hi"}],"stream":true,"max_tokens":60000}`)
	direct := append(routed[:len(routed)-1:len(routed)-1], []byte(`,"bootstrap_host":"`+sim.FakeBootstrapHost+`","bootstrap_port":8998,"bootstrap_room":1}`)...)

	inUse := func() (heap, stack uint64) {
		runtime.GC()
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapInuse, ms.StackInuse
	}
	// hold opens the streams one after another, each waiting for its first
	// chunk (as streams accumulate in a steady state, so that one prefill
	// connection serves them all), and returns the memory in use while they
	// are all open.
	hold := func(url string, body []byte) (heap, stack float64) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: streams, DisableCompression: true}}
		defer client.CloseIdleConnections()
		h0, s0 := inUse()
		open := make(chan error)
		for range streams {
			go func() {
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
				resp, err := client.Do(req)
				if err != nil {
					open <- err
					return
				}
				defer resp.Body.Close()
				_, err = bufio.NewReaderSize(resp.Body, 16).ReadString('\n')
				open <- err
				<-ctx.Done()
			}()
			if err := <-open; err != nil {
				b.Fatal(err)
			}
		}
		// Past a slow decode's first gap between tokens, when the router
		// takes a slow stream over: the measurement's moment, the same for
		// both arms, not a wait for an event.
		time.Sleep(max(200*time.Millisecond, 2*perToken))
		h1, s1 := inUse()
		return (float64(h1) - float64(h0)) / streams / 1024, (float64(s1) - float64(s0)) / streams / 1024
	}
	for b.Loop() {
		before := runtime.NumGoroutine()
		dh, ds := hold(dp.URL+"/v1/chat/completions", direct)
		// The direct streams' goroutines and connections are gone before
		// the routed arm takes its baseline.
		simtest.WaitFor(b, "the direct streams' goroutines to end", func() bool { return runtime.NumGoroutine() <= before })
		rh, rs := hold(srv.URL+"/v1/chat/completions", routed)
		b.ReportMetric(dh+ds, "direct-KiB/stream")
		b.ReportMetric(rh+rs, "routed-KiB/stream")
		b.ReportMetric(rh-dh, "router-heap-KiB/stream")
		b.ReportMetric(rs-ds, "router-stack-KiB/stream")
		b.ReportMetric(rh+rs-dh-ds, "router-KiB/stream")
	}
}
