package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/pdplane/pdplane/cli"
	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/server/api"
)

// client is what the commands over the REST API (peers, pairs, events)
// share: the control plane, the admin token, the output format.
type client struct {
	*api.ClientWithResponses
	base   string
	token  string
	output string
	out    io.Writer
}

// clientFlags are the flags of every command over the REST API. legacy adds
// the deprecated --server and --token that `peers` took.
type clientFlags struct {
	controlPlane, adminToken string
	credentialFile           string
	legacyServer, legacyTok  string
	output                   string
}

func (c *clientFlags) register(fs *cli.FlagSet, legacy, read bool) {
	fs.Str(&c.controlPlane, "control-plane", "http://127.0.0.1:8080", "base URL of pdplane serve (of several, comma-separated, the first)")
	fs.Str(&c.adminToken, "admin-token", "", "the control plane's admin token: needed to drain, mark stale, remove, lift, and for show --full")
	fs.Str(&c.credentialFile, "credential-file", "", "act as the peer whose credential this file holds (pdplane agent --credential-file): "+
		"a peer may drain itself, as an engine going away does")
	if legacy {
		fs.DeprecatedStr(&c.legacyServer, "server", "control-plane")
		fs.DeprecatedStr(&c.legacyTok, "token", "admin-token")
	}
	if read {
		fs.OutputFlag(&c.output)
	}
}

func (c *clientFlags) client(out io.Writer) (*client, error) {
	base, token := c.controlPlane, c.adminToken
	if c.legacyServer != "" && base == "http://127.0.0.1:8080" {
		base = c.legacyServer
	}
	if token == "" {
		token = c.legacyTok
	}
	if c.credentialFile != "" {
		b, err := os.ReadFile(c.credentialFile)
		if err != nil {
			return nil, fmt.Errorf("--credential-file: %w", err)
		}
		token = strings.TrimSpace(string(b))
	}
	base = cli.FirstToken(base)
	opts := []api.ClientOption{api.WithHTTPClient(&http.Client{Timeout: 15 * time.Second})}
	if token != "" {
		opts = append(opts, api.WithRequestEditorFn(func(_ context.Context, r *http.Request) error {
			r.Header.Set("Authorization", "Bearer "+token)
			return nil
		}))
	}
	cl, err := api.NewClientWithResponses(base, opts...)
	if err != nil {
		return nil, err
	}
	output := c.output
	if output == "" {
		output = "table"
	}
	return &client{ClientWithResponses: cl, base: base, token: token, output: output, out: out}, nil
}

// subcommand is one verb of a command group such as `peers`.
type subcommand struct {
	name     string
	args     string // the positional arguments in the synopsis, e.g. "PEER"
	summary  string
	read     bool                  // takes -o
	nargs    int                   // positional arguments required; -1: any
	setup    func(fs *cli.FlagSet) // registers the verb's own flags
	run      func(ctx context.Context, c *client, args []string) error
	synopsis string // overrides "pdplane GROUP NAME ARGS [flags]"
}

// group is a command with verbs: `pdplane peers list`.
type group struct {
	name   string
	about  string
	legacy bool // takes the deprecated --server and --token
	subs   []subcommand
	out    io.Writer
}

func (g *group) usage() string {
	var b strings.Builder
	fmt.Fprintf(&b, "Usage:\n")
	w := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	for _, s := range g.subs {
		fmt.Fprintf(w, "  pdplane %s %s %s\t%s\n", g.name, s.name, s.args, s.summary)
	}
	w.Flush()
	fmt.Fprintf(&b, "\n%s\nEvery verb takes --control-plane URL ($PDPLANE_CONTROL_PLANE) and --admin-token T\n($PDPLANE_ADMIN_TOKEN); run 'pdplane %s VERB -h' for its flags.\n", g.about, g.name)
	return b.String()
}

func (g *group) run(ctx context.Context, args []string) error {
	out := g.out
	if out == nil {
		out = os.Stdout
	}
	if len(args) == 0 {
		fmt.Fprint(os.Stderr, g.usage())
		return cli.Usagef("%s: a verb is required", g.name)
	}
	verb, args := args[0], args[1:]
	if verb == "-h" || verb == "--help" || verb == "-help" || verb == "help" {
		fmt.Fprint(out, g.usage())
		return nil
	}
	var sub *subcommand
	for i := range g.subs {
		if g.subs[i].name == verb {
			sub = &g.subs[i]
		}
	}
	if sub == nil {
		fmt.Fprint(os.Stderr, g.usage())
		return cli.Usagef("%s: unknown verb %q", g.name, verb)
	}
	fs := cli.NewFlagSet(g.name + " " + sub.name)
	fs.Stdout = out
	fs.Synopsis = sub.synopsis
	if fs.Synopsis == "" {
		fs.Synopsis = strings.Join(strings.Fields(fmt.Sprintf("pdplane %s %s %s [flags]", g.name, sub.name, sub.args)), " ")
	}
	fs.About = sub.summary
	var cf clientFlags
	cf.register(fs, g.legacy, sub.read)
	if sub.setup != nil {
		sub.setup(fs)
	}
	pos, err := fs.ParseArgs(args)
	if err != nil {
		return err
	}
	if sub.nargs >= 0 && len(pos) != sub.nargs {
		what := "no arguments"
		if sub.nargs > 0 {
			what = sub.args
		}
		return cli.Usagef("%s %s takes %s, got %d argument(s) (see 'pdplane %s %s -h')", g.name, sub.name, what, len(pos), g.name, sub.name)
	}
	c, err := cf.client(out)
	if err != nil {
		return err
	}
	return sub.run(ctx, c, pos)
}

// print writes an API answer: as a table (table), or its body re-indented
// (json) or converted (yaml).
func (c *client) print(body []byte, table func(w io.Writer) error) error {
	switch c.output {
	case "json":
		var buf bytes.Buffer
		if err := json.Indent(&buf, bytes.TrimSpace(body), "", "  "); err != nil {
			return err
		}
		buf.WriteByte('\n')
		_, err := c.out.Write(buf.Bytes())
		return err
	case "yaml":
		y, err := yaml.JSONToYAML(body)
		if err != nil {
			return err
		}
		_, err = c.out.Write(y)
		return err
	}
	w := tabwriter.NewWriter(c.out, 0, 4, 2, ' ', 0)
	if err := table(w); err != nil {
		return err
	}
	return w.Flush()
}

// answerError prints the problem detail of a refused call.
func answerError(status int, body []byte) error {
	var p api.Problem
	if json.Unmarshal(body, &p) == nil && p.Detail != "" {
		return fmt.Errorf("%d %s: %s", status, p.Title, p.Detail)
	}
	return fmt.Errorf("control plane answered %d: %s", status, bytes.TrimSpace(body))
}

// resolvePeer turns a peer name or id into the peer's id and name.
func (c *client) resolvePeer(ctx context.Context, nameOrID string) (api.PeerSummary, error) {
	if nameOrID == "" {
		return api.PeerSummary{}, errors.New("empty peer name")
	}
	resp, err := c.ListPeersWithResponse(ctx, &api.ListPeersParams{})
	if err != nil {
		return api.PeerSummary{}, err
	}
	if resp.JSON200 == nil {
		return api.PeerSummary{}, answerError(resp.StatusCode(), resp.Body)
	}
	var named []api.PeerSummary
	for _, p := range resp.JSON200.Peers {
		if p.Id == nameOrID {
			return p, nil
		}
		if p.Name == nameOrID {
			named = append(named, p)
		}
	}
	switch len(named) {
	case 1:
		return named[0], nil
	case 0:
		if registry.IsPeerID(nameOrID) {
			// Not listed, perhaps gone; let the call say so.
			return api.PeerSummary{Id: nameOrID, Name: nameOrID}, nil
		}
		return api.PeerSummary{}, fmt.Errorf("no peer named %q (pdplane peers list shows them)", nameOrID)
	}
	ids := make([]string, len(named))
	for i, p := range named {
		ids[i] = p.Id + " (" + string(p.Role) + ")"
	}
	return api.PeerSummary{}, fmt.Errorf("%d peers are named %q: %s; give the id", len(named), nameOrID, strings.Join(ids, ", "))
}

func orDash(s *string) string {
	if s == nil || *s == "" {
		return "-"
	}
	return *s
}

func timeOrDash(t *time.Time) string {
	if t == nil || t.IsZero() {
		return "-"
	}
	return t.Local().Format(time.DateTime)
}
