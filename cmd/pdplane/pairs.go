package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"time"

	"github.com/pdplane/pdplane/cli"
	"github.com/pdplane/pdplane/server/api"
)

// runPairs is the CLI over GET /api/v1/pairs and the quarantine lift.
func runPairs(ctx context.Context, args []string) error {
	return pairsCmd(ctx, args, os.Stdout)
}

func pairsCmd(ctx context.Context, args []string, out io.Writer) error {
	return pairsGroup(out).run(ctx, args)
}

func pairsGroup(out io.Writer) *group {
	var limit int
	return &group{
		name:  "pairs",
		about: "PREFILL and DECODE are peers' names or ids.",
		out:   out,
		subs: []subcommand{{
			name: "list", summary: "every (prefill, decode) pair with its verdict", read: true,
			setup: func(fs *cli.FlagSet) {
				fs.Int(&limit, "limit", 0, "at most this many pairs (0: the server's default)")
			},
			run: func(ctx context.Context, c *client, _ []string) error {
				return listPairs(ctx, c, limit)
			},
		}, {
			name: "lift", args: "PREFILL DECODE", nargs: 2, summary: "lift the pair's quarantine (admin)",
			run: func(ctx context.Context, c *client, args []string) error {
				return liftQuarantine(ctx, c, args[0], args[1])
			},
		}},
	}
}

func listPairs(ctx context.Context, c *client, limit int) error {
	params := &api.ListPairsParams{}
	if limit > 0 {
		params.Limit = &limit
	}
	resp, err := c.ListPairsWithResponse(ctx, params)
	if err != nil {
		return err
	}
	if resp.JSON200 == nil {
		return answerError(resp.StatusCode(), resp.Body)
	}
	return c.print(resp.Body, func(w io.Writer) error {
		fmt.Fprintln(w, "PREFILL\tDECODE\tVERDICT\tQUARANTINE\tREASON")
		for _, p := range resp.JSON200.Pairs {
			verdict := "refused"
			switch {
			case p.Routable:
				verdict = "routable"
			case p.Compatible:
				verdict = "not routable"
			}
			quarantine := "-"
			if q := p.Quarantine; q != nil {
				quarantine = "QUARANTINED"
				if q.Trial {
					quarantine = "on trial"
				} else if q.ExpiresAt != nil {
					quarantine += " until " + q.ExpiresAt.Local().Format(time.DateTime)
				}
			}
			reason := ""
			if p.Reason != nil {
				reason = *p.Reason
			}
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", p.Prefill.Name, p.Decode.Name, verdict, quarantine, reason)
		}
		fmt.Fprintf(w, "%d pairs\n", resp.JSON200.Total)
		return nil
	})
}

func liftQuarantine(ctx context.Context, c *client, prefill, decode string) error {
	pf, err := c.resolvePeer(ctx, prefill)
	if err != nil {
		return err
	}
	d, err := c.resolvePeer(ctx, decode)
	if err != nil {
		return err
	}
	resp, err := c.LiftQuarantineWithResponse(ctx, pf.Id, d.Id)
	if err != nil {
		return err
	}
	if resp.StatusCode() != http.StatusNoContent {
		return fmt.Errorf("lift quarantine of %s → %s: %w", prefill, decode, answerError(resp.StatusCode(), resp.Body))
	}
	fmt.Fprintf(c.out, "lifted the quarantine of %s → %s\n", pf.Name, d.Name)
	return nil
}
