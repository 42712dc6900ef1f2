// Command pdplane is the control plane and router for prefill/decode
// disaggregated LLM serving. This package only parses configuration and
// wires the other packages together.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

const usage = `pdplane — control plane and router for prefill/decode disaggregated LLM serving

Usage:
  pdplane serve    [flags]   control plane + OpenAI-compatible router
  pdplane dev      [flags]   serve + simulated prefill and decode engines, for trying things out
  pdplane sim      [flags]   a simulated SGLang/vLLM engine (prefill or decode), with its agent
  pdplane agent    [flags]   host agent for a real engine described by a spec file
  pdplane migrate  [flags]   apply database migrations and exit
  pdplane peers    list|show|drain|stale|rm   CLI over the REST API
  pdplane pairs    list|lift                  pairs and their verdicts; lift a quarantine
  pdplane version            print the version

Run 'pdplane COMMAND -h' for a command's flags. Every flag can also be set
with the PDPLANE_* environment variable named beside it.
`

func main() {
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var err error
	switch cmd, args := os.Args[1], os.Args[2:]; cmd {
	case "serve":
		err = runServe(ctx, args)
	case "dev":
		err = runDev(ctx, args)
	case "sim":
		err = runSim(ctx, args)
	case "agent":
		err = runAgent(ctx, args)
	case "migrate":
		err = runMigrate(ctx, args)
	case "peers":
		err = runPeers(ctx, args)
	case "pairs":
		err = runPairs(ctx, args)
	case "healthcheck":
		err = runHealthcheck(ctx, args)
	case "version", "--version", "-v":
		fmt.Println("pdplane", version)
	case "help", "-h", "--help":
		fmt.Print(usage)
	default:
		fmt.Fprintf(os.Stderr, "pdplane: unknown command %q\n\n%s", cmd, usage)
		os.Exit(2)
	}
	if err != nil && !errors.Is(err, flag.ErrHelp) {
		fmt.Fprintln(os.Stderr, "pdplane:", err)
		os.Exit(1)
	}
}
