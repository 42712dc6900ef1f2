package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"time"

	"github.com/pdplane/pdplane/bench"
	"github.com/pdplane/pdplane/cli"
)

const benchUsage = `Usage:
  pdplane bench compare [flags]   pdplane's router side by side with SMG and vllm-router
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
		if bin = bench.FindRouter(bin, name); bin == "" {
			if require {
				return fmt.Errorf("%s: executable not found (set --%s, or run with --install)", name, name)
			}
			fmt.Fprintf(os.Stderr, "pdplane bench: skipping %s: executable not found (set --%s, or run with --install)\n", name, name)
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
