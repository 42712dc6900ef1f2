package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"text/tabwriter"
	"time"

	"github.com/pdplane/pdplane/server/api"
)

const peersUsage = `Usage:
  pdplane peers list  [--role R] [--state S] [--model M]
  pdplane peers show  ID [--full]
  pdplane peers drain ID
  pdplane peers stale ID --reason TEXT [--error TEXT]
  pdplane peers rm    ID

Flags common to all: --server URL ($PDPLANE_SERVER), --token T ($PDPLANE_TOKEN).
`

// runPeers is a small CLI over the generated client.
func runPeers(ctx context.Context, args []string) error {
	if len(args) == 0 {
		fmt.Fprint(os.Stderr, peersUsage)
		return errors.New("peers: a subcommand is required")
	}
	sub, args := args[0], args[1:]
	var serverURL, token, role, state, model, reason, errText string
	var full bool
	fs := newFlagSet("peers " + sub)
	fs.str(&serverURL, "server", "http://127.0.0.1:8080", "control plane base URL")
	fs.str(&token, "token", "", "bearer token (admin for drain and rm)")
	switch sub {
	case "list":
		fs.StringVar(&role, "role", "", "filter by role")
		fs.StringVar(&state, "state", "", "filter by state")
		fs.StringVar(&model, "model", "", "filter by model")
	case "show":
		fs.BoolVar(&full, "full", false, "the full registration (KV pointers, agent metadata, transfer secrets); needs the admin token or a peer credential")
	case "stale":
		fs.StringVar(&reason, "reason", "", "why the peer is stale (required)")
		fs.StringVar(&errText, "error", "", "the error text that revealed it")
	}
	// Accept the ID before or after the flags.
	var id string
	if len(args) > 0 && len(args[0]) > 0 && args[0][0] != '-' {
		id, args = args[0], args[1:]
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if id == "" && fs.NArg() > 0 {
		id = fs.Arg(0)
	}
	opts := []api.ClientOption{api.WithHTTPClient(&http.Client{Timeout: 15 * time.Second})}
	if token != "" {
		opts = append(opts, api.WithRequestEditorFn(func(_ context.Context, r *http.Request) error {
			r.Header.Set("Authorization", "Bearer "+token)
			return nil
		}))
	}
	c, err := api.NewClientWithResponses(serverURL, opts...)
	if err != nil {
		return err
	}
	if sub != "list" && id == "" {
		return fmt.Errorf("peers %s: a peer ID is required", sub)
	}
	switch sub {
	case "list":
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
		w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(w, "ID\tNAME\tROLE\tENGINE\tMODEL\tSTATE\tGEN\tURL")
		for _, p := range resp.JSON200.Peers {
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\n", p.Id, p.Name, p.Role, p.Engine, p.Model, p.State, p.Generation, p.Url)
		}
		return w.Flush()
	case "show":
		if full {
			resp, err := c.GetPeerRegistrationWithResponse(ctx, id)
			if err != nil {
				return err
			}
			return printJSON(resp.StatusCode(), resp.Body, resp.JSON200 != nil)
		}
		resp, err := c.GetPeerWithResponse(ctx, id)
		if err != nil {
			return err
		}
		return printJSON(resp.StatusCode(), resp.Body, resp.JSON200 != nil)
	case "drain":
		resp, err := c.DrainPeerWithResponse(ctx, id)
		if err != nil {
			return err
		}
		return printJSON(resp.StatusCode(), resp.Body, resp.JSON200 != nil)
	case "stale":
		if reason == "" {
			return errors.New("peers stale: --reason is required")
		}
		body := api.StaleReport{Reason: reason}
		if errText != "" {
			body.Error = &errText
		}
		resp, err := c.MarkPeerStaleWithResponse(ctx, id, body)
		if err != nil {
			return err
		}
		return printJSON(resp.StatusCode(), resp.Body, resp.JSON200 != nil)
	case "rm":
		resp, err := c.DeletePeerWithResponse(ctx, id)
		if err != nil {
			return err
		}
		if resp.StatusCode() != http.StatusNoContent {
			return answerError(resp.StatusCode(), resp.Body)
		}
		fmt.Println("removed", id)
		return nil
	}
	fmt.Fprint(os.Stderr, peersUsage)
	return fmt.Errorf("peers: unknown subcommand %q", sub)
}

func printJSON(status int, body []byte, ok bool) error {
	if !ok {
		return answerError(status, body)
	}
	var v any
	if err := json.Unmarshal(body, &v); err != nil {
		return err
	}
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// answerError prints the problem detail of a refused call.
func answerError(status int, body []byte) error {
	var p api.Problem
	if json.Unmarshal(body, &p) == nil && p.Detail != "" {
		return fmt.Errorf("%d %s: %s", status, p.Title, p.Detail)
	}
	return fmt.Errorf("control plane answered %d: %s", status, body)
}
