package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/pdplane/pdplane/cli"
	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/server/api"
)

// runPeers is the CLI over the peers of GET/POST/DELETE /api/v1/peers.
func runPeers(ctx context.Context, args []string) error {
	return peersGroup(os.Stdout).run(ctx, args)
}

func peersGroup(out io.Writer) *group {
	var role, state, model, reason, errText string
	var full, wait bool
	var waitFor time.Duration
	return &group{
		name:   "peers",
		about:  "PEER is a peer's name or its id.",
		legacy: true,
		out:    out,
		subs: []subcommand{{
			name: "list", args: "", summary: "the peers, filtered by role, state or model", read: true,
			setup: func(fs *cli.FlagSet) {
				fs.Choice(&role, "role", "", []string{"prefill", "decode", "both"}, "only peers of this role")
				fs.Choice(&state, "state", "", []string{"pending", "ready", "unhealthy", "draining", "stale", "failed"}, "only peers in this state")
				fs.Str(&model, "model", "", "only peers serving this model")
			},
			run: func(ctx context.Context, c *client, _ []string) error {
				return listPeersCmd(ctx, c, role, state, model)
			},
		}, {
			name: "show", args: "PEER", nargs: 1, summary: "one peer; --full: its whole registration (admin)", read: true,
			setup: func(fs *cli.FlagSet) {
				fs.Bool(&full, "full", false, "the full registration (KV pointers, agent metadata, transfer secrets); needs the admin token")
			},
			run: func(ctx context.Context, c *client, args []string) error {
				return showPeer(ctx, c, args[0], full)
			},
		}, {
			name: "drain", args: "PEER", nargs: 1, summary: "take the peer out of routing; requests in flight finish (admin, or the peer's own credential)", read: true,
			synopsis: "pdplane peers drain PEER [--wait [--timeout D]] [flags]\npdplane peers drain self --credential-file F [--wait [--timeout D]] [flags]",
			setup: func(fs *cli.FlagSet) {
				fs.Bool(&wait, "wait", false, "return only once the peer may be stopped: no request in flight in either role, no KV handoff pending "+
					"(GET /api/v1/peers/{id}/drain); exit 1 when --timeout passes first")
				fs.Dur(&waitFor, "timeout", 10*time.Minute, "how long --wait waits")
			},
			run: func(ctx context.Context, c *client, args []string) error {
				peer := args[0]
				if peer == "self" {
					id, ok := registry.CredentialPeerID(c.token)
					if !ok {
						return cli.Usagef("peers drain self: the token is not a peer's credential (give --credential-file)")
					}
					peer = id // the peer whose credential this is
				}
				p, err := c.resolvePeer(ctx, peer)
				if err != nil {
					return err
				}
				resp, err := c.DrainPeerWithResponse(ctx, p.Id)
				if err != nil {
					return err
				}
				if err := printPeerChange(c, "drained", resp.StatusCode(), resp.Body, resp.JSON200); err != nil || !wait {
					return err
				}
				return waitDrained(ctx, c, p.Id, p.Name, waitFor)
			},
		}, {
			name: "stale", args: "PEER", nargs: 1, summary: "mark the peer stale, which starts its heal (admin)", read: true,
			synopsis: "pdplane peers stale PEER --reason TEXT [--error TEXT] [flags]",
			setup: func(fs *cli.FlagSet) {
				fs.Str(&reason, "reason", "", "why the peer is stale (required)")
				fs.Str(&errText, "error", "", "the error text that revealed it")
			},
			run: func(ctx context.Context, c *client, args []string) error {
				if reason == "" {
					return cli.Usagef("peers stale: --reason is required")
				}
				p, err := c.resolvePeer(ctx, args[0])
				if err != nil {
					return err
				}
				body := api.StaleReport{Reason: reason}
				if errText != "" {
					body.Error = &errText
				}
				resp, err := c.MarkPeerStaleWithResponse(ctx, p.Id, body)
				if err != nil {
					return err
				}
				return printPeerChange(c, "marked stale", resp.StatusCode(), resp.Body, resp.JSON200)
			},
		}, {
			name: "rm", args: "PEER", nargs: 1, summary: "remove the peer from the registry (admin)",
			run: func(ctx context.Context, c *client, args []string) error {
				p, err := c.resolvePeer(ctx, args[0])
				if err != nil {
					return err
				}
				resp, err := c.DeletePeerWithResponse(ctx, p.Id)
				if err != nil {
					return err
				}
				if resp.StatusCode() != http.StatusNoContent {
					return answerError(resp.StatusCode(), resp.Body)
				}
				fmt.Fprintf(c.out, "removed %s (%s)\n", p.Name, p.Id)
				return nil
			},
		}},
	}
}

func listPeersCmd(ctx context.Context, c *client, role, state, model string) error {
	params := &api.ListPeersParams{}
	if role != "" {
		r := api.Role(role)
		params.Role = &r
	}
	if state != "" {
		s := api.State(state)
		params.State = &s
	}
	if model != "" {
		params.Model = &model
	}
	resp, err := c.ListPeersWithResponse(ctx, params)
	if err != nil {
		return err
	}
	if resp.JSON200 == nil {
		return answerError(resp.StatusCode(), resp.Body)
	}
	return c.print(resp.Body, func(w io.Writer) error {
		fmt.Fprintln(w, "NAME\tROLE\tENGINE\tMODEL\tSTATE\tGEN\tURL\tID")
		for _, p := range resp.JSON200.Peers {
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\n", p.Name, p.Role, p.Engine, p.Model, p.State, p.Generation, p.Url, p.Id)
		}
		return nil
	})
}

func showPeer(ctx context.Context, c *client, nameOrID string, full bool) error {
	p, err := c.resolvePeer(ctx, nameOrID)
	if err != nil {
		return err
	}
	if full {
		resp, err := c.GetPeerRegistrationWithResponse(ctx, p.Id)
		if err != nil {
			return err
		}
		if resp.JSON200 == nil {
			return answerError(resp.StatusCode(), resp.Body)
		}
		if c.output == "table" {
			c.output = "yaml" // a registration is too deep for a table
		}
		return c.print(resp.Body, nil)
	}
	resp, err := c.GetPeerWithResponse(ctx, p.Id)
	if err != nil {
		return err
	}
	if resp.JSON200 == nil {
		return answerError(resp.StatusCode(), resp.Body)
	}
	return c.print(resp.Body, func(w io.Writer) error { return peerTable(w, resp.JSON200) })
}

// peerTable is one peer as NAME: value lines.
func peerTable(w io.Writer, p *api.PeerSummary) error {
	row := func(k, v string) { fmt.Fprintf(w, "%s:\t%s\n", k, v) }
	row("name", p.Name)
	row("id", p.Id)
	row("role", string(p.Role))
	row("engine", string(p.Engine))
	row("model", p.Model)
	state := string(p.State)
	if p.StateReason != nil && *p.StateReason != "" {
		state += " (" + *p.StateReason + ")"
	}
	row("state", state)
	row("url", p.Url)
	row("generation", fmt.Sprint(p.Generation))
	row("instance", p.InstanceId)
	row("load", fmt.Sprintf("%d running, %d queued, KV %.0f%%", p.Load.Running, p.Load.Queued, 100*p.Load.KvUsage))
	row("last heartbeat", timeOrDash(p.LastHeartbeat))
	row("lease expiry", timeOrDash(&p.LeaseExpiry))
	if h := p.Heal; h != nil {
		row("heal", fmt.Sprintf("%s from generation %d, until %s %s", h.Phase, h.FromGeneration, timeOrDash(&h.Deadline), orDash(h.Reason)))
	}
	if p.Labels != nil && len(*p.Labels) > 0 {
		var ls []string
		for k, v := range *p.Labels {
			ls = append(ls, k+"="+v)
		}
		sort.Strings(ls)
		row("labels", strings.Join(ls, ","))
	}
	return nil
}

// printPeerChange prints the peer a drain or stale mark answered with.
func printPeerChange(c *client, did string, status int, body []byte, p *api.PeerSummary) error {
	if p == nil {
		return answerError(status, body)
	}
	return c.print(body, func(w io.Writer) error {
		_, err := fmt.Fprintf(w, "%s %s (%s): now %s\n", did, p.Name, p.Id, p.State)
		return err
	})
}

// drainWaitPoll is how often `peers drain --wait` asks whether the drain is
// complete: an engine's load comes with its heartbeats, seconds apart.
const drainWaitPoll = 500 * time.Millisecond

// waitDrained polls the drain's progress until the peer may be stopped,
// saying what it waits for whenever that changes; an error when within
// passes first. A control plane that does not answer for a while (a
// replica restarting) is asked again.
func waitDrained(ctx context.Context, c *client, id, name string, within time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	t := time.NewTicker(drainWaitPoll)
	defer t.Stop()
	last := ""
	for {
		resp, err := c.GetDrainWithResponse(ctx, id)
		switch {
		case err != nil:
			last = err.Error()
		case resp.JSON200 == nil:
			return answerError(resp.StatusCode(), resp.Body)
		case resp.JSON200.Safe:
			fmt.Fprintf(c.out, "%s is drained: nothing in flight, safe to stop\n", name)
			return nil
		case resp.JSON200.Reason != last:
			last = resp.JSON200.Reason
			fmt.Fprintf(c.out, "waiting: %s\n", last)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("peers drain: %s not drained within %s (%s)", name, within, last)
		case <-t.C:
		}
	}
}
