package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"slices"
	"strconv"
	"time"

	"github.com/pdplane/pdplane/bench"
	"github.com/pdplane/pdplane/cli"
)

const benchUsage = `Usage:
  pdplane bench compare [flags]   pdplane's router side by side with SMG and vllm-router
  pdplane bench routing [flags]   cache hit rate and TTFT each router gets a fleet on the same prefix-heavy traffic
  pdplane bench floor [flags]     the harness's baseline: a bare SGLang PD relay, not a router

Run 'pdplane bench VERB -h' for its flags.
`

// runBench dispatches `pdplane bench VERB`.
func runBench(ctx context.Context, args []string) error {
	return benchCmd(ctx, args, os.Stdout)
}

func benchCmd(ctx context.Context, args []string, out io.Writer) error {
	if len(args) == 0 {
		return cli.Usagef("bench: a verb is required\n\n%s", benchUsage)
	}
	switch args[0] {
	case "compare":
		return benchCompare(ctx, args[1:], out)
	case "routing":
		return benchRouting(ctx, args[1:], out)
	case "floor":
		return benchFloor(ctx, args[1:])
	case "-h", "--help", "help":
		fmt.Fprint(out, benchUsage)
		return nil
	}
	return cli.Usagef("bench: unknown verb %q\n\n%s", args[0], benchUsage)
}

// benchCompare parses the flags of `pdplane bench compare`, finds the
// routers and runs bench.Compare.
func benchCompare(ctx context.Context, args []string, out io.Writer) error {
	var (
		cfg                               bench.Config
		concurrency, mode, peers, held    string
		smgBin, vllmRouterBin, pdplaneBin string
		baselineBin                       string
		require, install                  bool
	)
	fs := cli.NewFlagSet("bench compare")
	fs.About = `Starts pdplane sim engines once per engine kind (SGLang for SMG, vLLM for
vllm-router), registers them with a pdplane serve, puts each peer router in
front of the same engines, and runs the same load through pdplane and the peer
in alternating windows. Measures the router processes: CPU per request from
/proc (and, beside it, the engines'), client-side time to first token, and RSS and file descriptors per
stream held open on a slow decode, at each level of --held-streams in turn,
with the time to first token of new requests sent while the streams are held.
Prints Markdown tables per peer.`
	fs.Dur(&cfg.Window, "duration", 8*time.Second, "length of one measured window")
	fs.Str(&concurrency, "concurrency", "32", "concurrent clients, or a comma-separated list of them (e.g. 32,256)")
	fs.Choice(&mode, "mode", "stream", []string{"stream", "unary", "both"}, "streamed (SSE) or unary requests, or both")
	fs.Int(&cfg.Rounds, "rounds", 2, "windows per router for each mode and concurrency, alternating pdplane, peer, then peer, pdplane, and so on: an even number cancels a steady drift of the host's speed (held streams are measured through pdplane first)")
	fs.Str(&held, "held-streams", "500", "streams held open on a slow decode to measure memory per stream and new requests' TTFT meanwhile, or a comma-separated list of levels measured in turn through the same router (e.g. 100,9000); 0 skips it")
	fs.Int(&cfg.ProbeClients, "probe-clients", 8, "concurrent clients sending new requests while each level's streams are held")
	fs.Dur(&cfg.ProbeWindow, "probe-duration", 2*time.Second, "how long they send them, a window")
	fs.Int(&cfg.ProbeRounds, "probe-rounds", 3, "windows of new requests at each level; its TTFT p99 is the median window's")
	fs.Dur(&cfg.HeldTokenTime, "held-token-time", time.Second, "the slow decode's time per token, the pace of each held stream (longer: held streams mostly idle)")
	fs.Int(&cfg.MaxTokens, "max-tokens", 16, "tokens generated per request")
	fs.Str(&peers, "peers", bench.PeerSMG+","+bench.PeerVLLMRouter, "comma-separated routers to compare with: smg, vllm-router, floor and floor-net-http (baselines: 'pdplane bench floor'), and baseline (--baseline); empty measures pdplane alone")
	fs.Str(&baselineBin, "baseline", "", "another pdplane binary (e.g. the commit before a change) for the baseline peer: its serve, with engines of its own, measured in windows alternating with this pdplane's")
	fs.Str(&smgBin, "smg", "", "SMG executable (default: .venv/bin/smg, else smg on $PATH)")
	fs.Str(&vllmRouterBin, "vllm-router", "", "vllm-router executable (default: .venv/bin/vllm-router, else vllm-router on $PATH)")
	fs.Str(&pdplaneBin, "pdplane", "", "pdplane binary to run serve and sim with (default: this one)")
	fs.Bool(&require, "require", false, "fail when a peer's executable is missing instead of skipping it")
	fs.Bool(&install, "install", false, "first install SMG and vllm-router from PyPI into .venv with scripts/install-routers.sh")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var err error
	if cfg.Concurrency, err = bench.ParseInts(concurrency); err != nil {
		return cli.Usagef("invalid value %q for --concurrency: %v", concurrency, err)
	}
	if held != "0" {
		if cfg.HeldStreams, err = bench.ParseInts(held); err != nil {
			return cli.Usagef("invalid value %q for --held-streams: %v", held, err)
		}
	}
	cfg.Modes = []bench.Mode{bench.Mode(mode)}
	if mode == "both" {
		cfg.Modes = []bench.Mode{bench.Stream, bench.Unary}
	}
	if pdplaneBin == "" {
		if pdplaneBin, err = os.Executable(); err != nil {
			return fmt.Errorf("find the pdplane binary: %w", err)
		}
	}
	cfg.Pdplane = pdplaneBin
	if baselineBin != "" && !slices.Contains(splitList(peers), bench.PeerBaseline) {
		return cli.Usagef("--baseline is measured only with --peers baseline (e.g. --peers baseline or --peers smg,baseline)")
	}
	if install {
		if smgBin, vllmRouterBin, err = bench.InstallRouters(ctx); err != nil {
			return err
		}
	}
	bins := map[string]string{bench.PeerSMG: smgBin, bench.PeerVLLMRouter: vllmRouterBin,
		bench.PeerFloor: pdplaneBin, bench.PeerFloorNetHTTP: pdplaneBin, bench.PeerBaseline: baselineBin}
	for _, name := range splitList(peers) {
		bin, ok := bins[name]
		if !ok {
			return cli.Usagef("invalid value %q for --peers: want smg, vllm-router, floor, floor-net-http and/or baseline", peers)
		}
		if name == bench.PeerBaseline {
			if bin == "" {
				return cli.Usagef("--peers baseline needs --baseline, the pdplane binary to compare with")
			}
			if _, err := os.Stat(bin); err != nil {
				return fmt.Errorf("baseline: %w", err)
			}
			cfg.Peers = append(cfg.Peers, bench.Peer{Name: name, Bin: bin})
			continue
		}
		if bin, err = peerBin(bin, name, require); err != nil {
			return err
		} else if bin == "" {
			continue
		}
		cfg.Peers = append(cfg.Peers, bench.Peer{Name: name, Bin: bin})
	}
	cfg.Progress = os.Stderr
	rep, err := bench.Compare(ctx, cfg)
	if rep != nil {
		rep.Print(out)
	}
	return err
}

// benchRouting parses the flags of `pdplane bench routing`, finds the
// peers and runs bench.Routing.
func benchRouting(ctx context.Context, args []string, out io.Writer) error {
	var (
		cfg                               bench.RoutingConfig
		workload, peers, output, plot     string
		smgBin, vllmRouterBin, pdplaneBin string
		seed                              int
		require, install                  bool
	)
	fs := cli.NewFlagSet("bench routing")
	fs.About = `Routing quality: sends the same seeded workload through each router, each in
front of a fleet of pdplane sims of its own started cold (prefills with a prefix
cache whose compute time counts uncached tokens only), and reports the share of
prompt tokens the prefills found cached, the prefill tokens computed per request,
client-side TTFT and end-to-end time, req/s and failures. pdplane (--prefill-policy
precise, from the sims' KV events) and pdplane-ring (--prefill-policy cache_aware)
always run; --peers adds SMG and vllm-router (--policy cache_aware; vllm-router on
vLLM sims) and the oracle, the harness's own router that asks every prefill for
its cache and queue before each pick. Progress goes to stderr; a run takes minutes.`
	fs.Choice(&workload, "workload", bench.WorkloadPrefixHeavy, []string{bench.WorkloadPrefixHeavy, bench.WorkloadNoShared, "both"},
		"prefix-heavy (multi-turn conversations over shared system prompts), no-shared (fresh prompts of the same lengths), or both")
	fs.Int(&cfg.Requests, "requests", 600, "requests of each workload")
	fs.Dur(&cfg.Duration, "duration", 0, "instead of --requests: send what the offered rate sends in this time")
	fs.Int(&seed, "seed", 1, "seed of the workload and its arrivals")
	cfg.Load = 0.7
	cli.Custom(fs, &cfg.Load, "load", "fraction", "a number above 0 such as 0.7", "0.5", parseLoad,
		func(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) },
		"offered rate as a fraction of the fleet's prefill capacity with no cache hit (Poisson arrivals)")
	fs.Int(&cfg.Prefills, "prefills", 4, "prefill sims in each router's fleet")
	fs.Int(&cfg.Decodes, "decodes", 2, "decode sims in each router's fleet")
	fs.Dur(&cfg.PrefillTimePerToken, "prefill-time-per-token", 100*time.Microsecond, "the prefills' compute time per uncached prompt token")
	fs.Int(&cfg.PrefillSlots, "prefill-slots", 1, "prefills each prefill sim computes at once")
	fs.Int(&cfg.PageSize, "page-size", 16, "tokens per KV page, the prefix cache's block")
	fs.Int(&cfg.KVPages, "kv-pages", 1024, "each prefill's KV pages, so its prefix cache's capacity (the default is below the prefix-heavy working set)")
	fs.Int(&cfg.CachePages, "cache-pages", 0, "each prefill's prefix cache in pages, if fewer than --kv-pages: a cache under pressure "+
		"while the pool still fits the requests in flight (0: the whole pool)")
	fs.Int(&cfg.MaxTokens, "max-tokens", 8, "tokens generated per request")
	fs.Str(&peers, "peers", bench.PeerSMG+","+bench.PeerVLLMRouter+","+bench.RouterOracle, "comma-separated routers to run beside pdplane and pdplane-ring: smg, vllm-router, oracle, pdplane-power-of-two; empty runs those two alone")
	fs.Choice(&output, "output", "table", []string{"table", "json"}, `table (Markdown), or json: {"routers": {"<router>": {"hit_rate", "prefill_tokens_per_request", "ttft_p50_ms", "ttft_p99_ms", "e2e_p99_ms", "rps", "failed"}}}, under {"workloads": {"<workload>": ...}} with --workload both`)
	fs.Shorthand("o", "output")
	fs.Str(&plot, "plot", "", "also write an SVG page of each router's TTFT distribution and hit rate to this file")
	fs.Str(&smgBin, "smg", "", "SMG executable (default: .venv/bin/smg, else smg on $PATH)")
	fs.Str(&vllmRouterBin, "vllm-router", "", "vllm-router executable (default: .venv/bin/vllm-router, else vllm-router on $PATH)")
	fs.Str(&pdplaneBin, "pdplane", "", "pdplane binary to run serve and sim with (default: this one)")
	fs.Bool(&require, "require", false, "fail when a peer's executable is missing instead of skipping it")
	fs.Bool(&install, "install", false, "first install SMG and vllm-router from PyPI into .venv with scripts/install-routers.sh")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if seed < 0 {
		return cli.Usagef("invalid value %d for --seed: want 0 or more", seed)
	}
	cfg.Seed = uint64(seed)
	cfg.Workloads = []string{workload}
	if workload == "both" {
		cfg.Workloads = []string{bench.WorkloadPrefixHeavy, bench.WorkloadNoShared}
	}
	var err error
	if pdplaneBin == "" {
		if pdplaneBin, err = os.Executable(); err != nil {
			return fmt.Errorf("find the pdplane binary: %w", err)
		}
	}
	cfg.Pdplane = pdplaneBin
	if install {
		if smgBin, vllmRouterBin, err = bench.InstallRouters(ctx); err != nil {
			return err
		}
	}
	cfg.Routers = []bench.Peer{{Name: bench.RouterPdplane}, {Name: bench.RouterPdplaneRing}}
	bins := map[string]string{bench.PeerSMG: smgBin, bench.PeerVLLMRouter: vllmRouterBin}
	for _, name := range splitList(peers) {
		if name == bench.RouterOracle || name == bench.RouterPdplaneP2C {
			cfg.Routers = append(cfg.Routers, bench.Peer{Name: name})
			continue
		}
		bin, ok := bins[name]
		if !ok {
			return cli.Usagef("invalid value %q for --peers: want smg, vllm-router, oracle and/or pdplane-power-of-two", peers)
		}
		if bin, err = peerBin(bin, name, require); err != nil {
			return err
		} else if bin == "" {
			continue
		}
		cfg.Routers = append(cfg.Routers, bench.Peer{Name: name, Bin: bin})
	}
	cfg.Progress = os.Stderr
	rep, err := bench.Routing(ctx, cfg)
	if rep == nil {
		return err
	}
	if output == "json" {
		if jerr := rep.WriteJSON(out); jerr != nil {
			return jerr
		}
	} else {
		rep.Print(out)
	}
	if plot != "" {
		if perr := writePlot(plot, rep); perr != nil {
			return perr
		}
	}
	if err == nil && rep.Failed() {
		err = errors.New("bench routing: a router was not measured or a request failed (see above)")
	}
	return err
}

// parseLoad reads --load.
func parseLoad(s string) (float64, error) {
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || f <= 0 || math.IsInf(f, 0) || math.IsNaN(f) {
		return 0, errors.New("want a number above 0")
	}
	return f, nil
}

// writePlot writes the report's SVG to path.
func writePlot(path string, rep *bench.RoutingReport) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("--plot: %w", err)
	}
	if err := rep.WriteSVG(f); err != nil {
		f.Close()
		return fmt.Errorf("--plot: %w", err)
	}
	return f.Close()
}

// benchFloor runs bench.Floor until ctx ends.
func benchFloor(ctx context.Context, args []string) error {
	var addr, prefill, decode string
	var port int
	var netHTTP bool
	fs := cli.NewFlagSet("bench floor")
	fs.About = `A baseline for 'pdplane bench compare --peers floor', not a router: relays
SGLang's PD protocol between HTTP/1.1 clients and one prefill and one decode
with nothing else (no validation, picking, retries, deadlines, metrics or
logs), so that a router's cost can be set against what Go's runtime and the
kernel cost for the same traffic. Trusts its engines; never expose it.`
	fs.Str(&addr, "addr", "127.0.0.1:8300", "listen address")
	fs.Str(&prefill, "prefill", "", "the SGLang prefill's URL (http://host:port)")
	fs.Int(&port, "bootstrap-port", 8998, "the prefill's bootstrap port")
	fs.Str(&decode, "decode", "", "the SGLang decode's URL (http://host:port)")
	fs.Bool(&netHTTP, "net-http", false, "serve the clients with net/http's server rather than the floor's own HTTP/1.1 reading")
	if err := fs.Parse(args); err != nil {
		return err
	}
	ph, err := bench.HostPort(prefill)
	if err != nil {
		return cli.Usagef("invalid value %q for --prefill: %v", prefill, err)
	}
	dh, err := bench.HostPort(decode)
	if err != nil {
		return cli.Usagef("invalid value %q for --decode: %v", decode, err)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	go func() {
		<-ctx.Done()
		ln.Close()
	}()
	f := &bench.Floor{Prefill: ph, Decode: dh, BootstrapPort: port, NetHTTP: netHTTP}
	if err := f.Serve(ln); ctx.Err() == nil {
		return err
	}
	return nil
}

// peerBin finds a peer router's executable; "" when it is not found and
// not required (the run goes on without it, and says so).
func peerBin(bin, name string, require bool) (string, error) {
	if bin = bench.FindRouter(bin, name); bin == "" {
		if require {
			return "", fmt.Errorf("%s: executable not found (set --%s, or run with --install)", name, name)
		}
		fmt.Fprintf(os.Stderr, "pdplane bench: skipping %s: executable not found (set --%s, or run with --install)\n", name, name)
	}
	return bin, nil
}
