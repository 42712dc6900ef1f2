package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"text/tabwriter"
	"time"

	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/server/api"
)

const pairsUsage = `Usage:
  pdplane pairs list                    every (prefill, decode) pair with its verdict
  pdplane pairs lift PREFILL DECODE     lift the pair's quarantine (peer names or ids; admin)

Flags: --control-plane URL ($PDPLANE_CONTROL_PLANE), --admin-token T ($PDPLANE_ADMIN_TOKEN).
`

// runPairs is the CLI over GET /api/v1/pairs and the quarantine lift.
func runPairs(ctx context.Context, args []string) error {
	return pairsCmd(ctx, args, os.Stdout)
}

func pairsCmd(ctx context.Context, args []string, out io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(os.Stderr, pairsUsage)
		return errors.New("pairs: a subcommand is required (list or lift)")
	}
	sub, args := args[0], args[1:]
	var controlPlane, token string
	fs := newFlagSet("pairs " + sub)
	fs.str(&controlPlane, "control-plane", "http://127.0.0.1:8080", "base URL of pdplane serve")
	fs.str(&token, "admin-token", "", "the control plane's admin token (needed by lift)")
	// Accept the positional arguments before or after the flags.
	var pos []string
	for len(args) > 0 && len(args[0]) > 0 && args[0][0] != '-' {
		pos, args = append(pos, args[0]), args[1:]
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if len(fs.errs) > 0 {
		return errors.Join(fs.errs...)
	}
	pos = append(pos, fs.Args()...)
	opts := []api.ClientOption{api.WithHTTPClient(&http.Client{Timeout: 15 * time.Second})}
	if token != "" {
		opts = append(opts, api.WithRequestEditorFn(func(_ context.Context, r *http.Request) error {
			r.Header.Set("Authorization", "Bearer "+token)
			return nil
		}))
	}
	c, err := api.NewClientWithResponses(controlPlane, opts...)
	if err != nil {
		return err
	}
	switch sub {
	case "list":
		if len(pos) > 0 {
			return fmt.Errorf("pairs list takes no arguments, got %q", pos)
		}
		return listPairs(ctx, c, out)
	case "lift":
		if len(pos) != 2 {
			return errors.New("pairs lift: PREFILL and DECODE (peer names or ids) are required")
		}
		return liftQuarantine(ctx, c, pos[0], pos[1], out)
	}
	fmt.Fprint(os.Stderr, pairsUsage)
	return fmt.Errorf("pairs: unknown subcommand %q", sub)
}

func listPairs(ctx context.Context, c *api.ClientWithResponses, out io.Writer) error {
	resp, err := c.ListPairsWithResponse(ctx, &api.ListPairsParams{})
	if err != nil {
		return err
	}
	if resp.JSON200 == nil {
		return answerError(resp.StatusCode(), resp.Body)
	}
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
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
	return w.Flush()
}

func liftQuarantine(ctx context.Context, c *api.ClientWithResponses, prefill, decode string, out io.Writer) error {
	pid, err := resolvePeer(ctx, c, prefill)
	if err != nil {
		return err
	}
	did, err := resolvePeer(ctx, c, decode)
	if err != nil {
		return err
	}
	resp, err := c.LiftQuarantineWithResponse(ctx, pid, did)
	if err != nil {
		return err
	}
	if resp.StatusCode() != http.StatusNoContent {
		return fmt.Errorf("lift quarantine of %s → %s: %w", prefill, decode, answerError(resp.StatusCode(), resp.Body))
	}
	fmt.Fprintf(out, "lifted the quarantine of %s → %s\n", prefill, decode)
	return nil
}

// resolvePeer turns a peer name or id into an id.
func resolvePeer(ctx context.Context, c *api.ClientWithResponses, nameOrID string) (string, error) {
	if registry.IsPeerID(nameOrID) {
		return nameOrID, nil
	}
	resp, err := c.ListPeersWithResponse(ctx, &api.ListPeersParams{})
	if err != nil {
		return "", err
	}
	if resp.JSON200 == nil {
		return "", answerError(resp.StatusCode(), resp.Body)
	}
	for _, p := range resp.JSON200.Peers {
		if p.Name == nameOrID {
			return p.Id, nil
		}
	}
	return "", fmt.Errorf("no peer named %q (pdplane peers list shows them)", nameOrID)
}
