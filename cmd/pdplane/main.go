// Command pdplane is the control plane and router for prefill/decode
// disaggregated LLM serving. This package only parses configuration and
// wires the other packages together.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/pdplane/pdplane/cli"
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
  pdplane peers    list|show|drain|stale|rm   the peers; a peer is named by its name or its id
  pdplane pairs    list|lift                  pairs and their verdicts; lift a quarantine
  pdplane events   [--peer P] [--follow]      the event log, or its live stream
  pdplane bench    compare                    pdplane's router side by side with SMG and vllm-router
  pdplane version            print the version

Run 'pdplane COMMAND -h' for a command's flags. Every flag can also be set
with the PDPLANE_* environment variable named beside it; a flag given on the
command line wins. serve, agent and sim also read their flags from a YAML
file (--config FILE), which the environment and the command line override;
--print-config shows the result. The read commands take -o table|json|yaml.
`

// commands are pdplane's subcommands.
var commands = map[string]func(context.Context, []string) error{
	"serve":       runServe,
	"dev":         runDev,
	"sim":         runSim,
	"agent":       runAgent,
	"migrate":     runMigrate,
	"peers":       runPeers,
	"pairs":       runPairs,
	"healthcheck": runHealthcheck,
	"events":      runEvents,
	"bench":       runBench,
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run runs one command line and returns the exit status: 0, 1 when the
// command failed, 2 when the command line is wrong.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	var err error
	switch cmd, args := args[0], args[1:]; cmd {
	case "version", "--version", "-v":
		fmt.Fprintln(stdout, "pdplane", version)
	case "help", "-h", "--help", "-help":
		fmt.Fprint(stdout, usage)
	default:
		f, ok := commands[cmd]
		if !ok {
			fmt.Fprintf(stderr, "pdplane: unknown command %q\n\n%s", cmd, usage)
			return 2
		}
		err = f(ctx, args)
	}
	return exitStatus(err, stderr)
}

func exitStatus(err error, stderr io.Writer) int {
	var ue *cli.UsageError
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp), errors.Is(err, cli.ErrPrinted):
		return 0
	case errors.As(err, &ue):
		fmt.Fprintln(stderr, "pdplane:", err)
		return 2
	default:
		fmt.Fprintln(stderr, "pdplane:", err)
		return 1
	}
}
