package pdplane_test

// The import rules of docs/architecture.md ("Imports point down", and the
// table of parts), checked from `go list` so that a change breaking one fails
// `go test ./...` (and so `make test`) with a message naming the rule.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"slices"
	"sort"
	"strings"
	"testing"
)

const module = "github.com/pdplane/pdplane"

// listedPackage is the part of `go list -json` the rules read.
type listedPackage struct {
	ImportPath   string
	Imports      []string
	TestImports  []string
	XTestImports []string
}

// layerRule is one rule: for every package it applies to, every import must
// be allowed. Paths are relative to the module ("registry", "server/api");
// imports outside the module are given in full.
type layerRule struct {
	name string
	// applies reports whether the rule governs pkg's production imports.
	applies func(pkg string) bool
	// allowed reports whether pkg may import imp.
	allowed func(pkg, imp string) bool
}

func is(paths ...string) func(string) bool {
	return func(p string) bool { return slices.Contains(paths, p) }
}

func under(root string) func(string) bool {
	return func(p string) bool { return p == root || strings.HasPrefix(p, root+"/") }
}

// internal reports whether imp is a pdplane package, and returns its
// module-relative path.
func internal(imp string) (string, bool) {
	if imp == module {
		return "", true
	}
	rel, ok := strings.CutPrefix(imp, module+"/")
	return rel, ok
}

// onlyInternal allows every import outside pdplane and, inside it, only
// the listed packages.
func onlyInternal(paths ...string) func(string, string) bool {
	return func(_, imp string) bool {
		rel, ok := internal(imp)
		return !ok || slices.Contains(paths, rel)
	}
}

// helper reports whether a package is a test-helper package
// (registry/registrytest, sim/simtest, ...): named <pkg>test and
// living beside the package it helps.
func helper(p string) bool {
	i := strings.LastIndex(p, "/")
	return i >= 0 && p[i+1:] == p[strings.LastIndex(p[:i], "/")+1:i]+"test"
}

var layerRules = []layerRule{
	{
		name:    "registry is the domain: it imports no other pdplane package",
		applies: is("registry"),
		allowed: onlyInternal(),
	},
	{
		name:    "migrations are embedded SQL: they import no other pdplane package",
		applies: is("migrations"),
		allowed: onlyInternal(),
	},
	{
		name:    "the stores implement registry.Store: registry/memstore imports only registry and registry/replica (its Broadcaster)",
		applies: is("registry/memstore"),
		allowed: onlyInternal("registry", "registry/replica"),
	},
	{
		name:    "the stores implement registry.Store: registry/pgstore imports only registry, registry/replica (its Broadcaster) and migrations",
		applies: is("registry/pgstore"),
		allowed: onlyInternal("registry", "registry/replica", "migrations"),
	},
	{
		name:    "registry/replica keeps each replica's view of the registry: it imports only registry",
		applies: is("registry/replica"),
		allowed: onlyInternal("registry"),
	},
	{
		name:    "all SQL lives in registry/pgstore: only it, migrations and registrytest's Postgres helpers import pgx",
		applies: func(p string) bool { return !is("registry/pgstore", "migrations", "registry/registrytest")(p) },
		allowed: func(_, imp string) bool { return !under("github.com/jackc/pgx")(imp) },
	},
	{
		name:    "the router never talks to the database or the control plane: router imports only registry, registry/replica, pdproto, httpwire, kvevents and kvindex",
		applies: is("router"),
		allowed: onlyInternal("registry", "registry/replica", "pdproto", "httpwire", "kvevents", "kvindex"),
	},
	{
		name:    "httpwire is HTTP plumbing, under the router: it imports no other pdplane package",
		applies: is("httpwire"),
		allowed: onlyInternal(),
	},
	{
		name:    "pdproto holds the engines' wire formats shared by router and sim: it imports only registry and transfer",
		applies: is("pdproto"),
		allowed: onlyInternal("registry", "transfer"),
	},
	{
		name:    "transfer sits under everything but registry: transfer imports only registry",
		applies: is("transfer"),
		allowed: onlyInternal("registry"),
	},
	{
		name:    "transfer backends plug into transfer: transfer/nixl, transfer/tcp and transfer/cuda import only registry and transfer",
		applies: is("transfer/nixl", "transfer/tcp", "transfer/cuda"),
		allowed: onlyInternal("registry", "transfer"),
	},
	{
		name:    "zmtp hardens ZeroMQ connections: it imports no other pdplane package",
		applies: is("zmtp"),
		allowed: onlyInternal(),
	},
	{
		name:    "kvevents reads the engines' KV events: it imports only zmtp",
		applies: is("kvevents"),
		allowed: onlyInternal("zmtp"),
	},
	{
		name:    "kvindex is the router's index of the engines' KV blocks, built from their events: it imports only kvevents",
		applies: is("kvindex"),
		allowed: onlyInternal("kvevents"),
	},
	{
		name:    "gcfloor and cli are the commands' process tuning and flags: they import no other pdplane package",
		applies: is("gcfloor", "cli"),
		allowed: onlyInternal(),
	},
	{
		name:    "server/api is generated from openapi.yaml: it imports no other pdplane package",
		applies: is("server/api"),
		allowed: onlyInternal(),
	},
	{
		name:    "the control plane is mounted on, not mounting: server imports only registry, registry/replica, pdproto, httpwire, server/api and server/api/apiconv (cmd/pdplane hands it the router and web)",
		applies: is("server"),
		allowed: onlyInternal("registry", "registry/replica", "pdproto", "httpwire", "server/api", "server/api/apiconv"),
	},
	{
		name:    "server/api/apiconv is the one conversion between the wire and the domain: it imports only registry, registry/replica and server/api",
		applies: is("server/api/apiconv"),
		allowed: onlyInternal("registry", "registry/replica", "server/api"),
	},
	{
		// The router takes a trace.TracerProvider and never this package;
		// cmd/pdplane builds the provider and wraps the store.
		name:    "tracing builds the tracer provider and traces store writes: it imports only registry",
		applies: is("tracing"),
		allowed: onlyInternal("registry"),
	},
	{
		name:    "web is embedded assets: it imports no other pdplane package",
		applies: is("web"),
		allowed: onlyInternal(),
	},
	{
		name:    "the agent speaks to the control plane through the generated client: agent imports only registry, pdproto (the engines' shapes), server/api, server/api/apiconv and transfer",
		applies: is("agent"),
		allowed: onlyInternal("registry", "pdproto", "server/api", "server/api/apiconv", "transfer"),
	},
	{
		name:    "the simulator is an engine: sim imports only registry, pdproto, httpwire (its body deadline), zmtp (its bootstrap plane), transfer and its backends",
		applies: is("sim"),
		allowed: onlyInternal("registry", "pdproto", "httpwire", "zmtp", "transfer", "transfer/nixl", "transfer/tcp"),
	},
	{
		// devfleet wires sims to agents; the control plane is a URL to it,
		// never something it builds.
		name:    "the dev fleet runs engines against a control plane it does not build: devfleet imports only registry, sim, agent and server/api",
		applies: is("devfleet"),
		allowed: onlyInternal("registry", "sim", "agent", "server/api"),
	},
	{
		// bench knows pdplane as a binary, as it knows SMG and
		// vllm-router: it measures processes from outside.
		name:    "the harness drives processes from outside: bench imports no pdplane package",
		applies: is("bench"),
		allowed: onlyInternal(),
	},
	{
		// realengine's tests run the pdplane binary and real vLLM
		// engines as processes; the package itself is only their doc.
		name:    "the real-engine suite drives real processes from outside: realengine imports no pdplane package",
		applies: is("realengine"),
		allowed: onlyInternal(),
	},
	{
		name:    "server/api is the wire between control plane and its clients: only server, server/api/apiconv, agent, devfleet and cmd/pdplane import it",
		applies: func(p string) bool { return !is("server", "server/api/apiconv", "agent", "devfleet", "cmd/pdplane")(p) },
		allowed: func(_, imp string) bool { return imp != module+"/server/api" },
	},
	{
		name:    "test helpers serve tests: production code never imports a <pkg>test package",
		applies: func(p string) bool { return !helper(p) },
		allowed: func(_, imp string) bool {
			rel, ok := internal(imp)
			return !ok || !helper(rel)
		},
	},
}

// everywhereRules govern test imports as well as production ones.
var everywhereRules = []layerRule{
	{
		name:    "cmd/pdplane is wiring only: nothing imports cmd/...",
		applies: func(p string) bool { return !under("cmd")(p) },
		allowed: func(_, imp string) bool {
			rel, ok := internal(imp)
			return !ok || !under("cmd")(rel)
		},
	},
	{
		name:    "deploy holds the deployment files and their offline checks: it imports no pdplane package (it checks the built binary from outside)",
		applies: is("deploy"),
		allowed: func(_, imp string) bool { _, ok := internal(imp); return !ok },
	},
	{
		name:    "the dev fleet is for `pdplane dev` and `pdplane sim`: nothing but cmd/pdplane (and devfleet's own tests) imports devfleet",
		applies: func(p string) bool { return !is("cmd/pdplane", "devfleet")(p) },
		allowed: func(_, imp string) bool { return imp != module+"/devfleet" },
	},
}

// governed lists the packages the per-package rules above cover; a new
// package must be placed in the layout (and given a rule) before it lands.
var governed = []string{
	"", // the module root: only this test
	"agent", "bench", "cli", "cmd/pdplane", "deploy", "devfleet", "gcfloor", "kvevents", "kvindex", "zmtp", "interop", "migrations", "pdproto", "realengine",
	"registry", "registry/memstore", "registry/pgstore", "registry/registrytest", "registry/replica",
	"router", "router/routertest", "httpwire", "server", "server/api", "server/api/apiconv",
	"sim", "sim/simtest",
	"tracing", "tracing/tracingtest",
	"transfer", "transfer/cuda", "transfer/nixl", "transfer/tcp", "transfer/tcp/tcptest", "transfer/transfertest",
	"web",
}

func listPackages(t *testing.T) []listedPackage {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the layout test needs the go command: %v", err)
	}
	cmd := exec.Command(goBin, "list", "-json", "./...")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.String())
	}
	var pkgs []listedPackage
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p listedPackage
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("decode go list output: %v", err)
		}
		pkgs = append(pkgs, p)
	}
	return pkgs
}

// violations applies the rules to pkgs and returns one line per broken
// edge, naming the rule.
func violations(pkgs []listedPackage) []string {
	var out []string
	check := func(rules []layerRule, rel string, imports []string, what string) {
		for _, r := range rules {
			if !r.applies(rel) {
				continue
			}
			for _, imp := range imports {
				if !r.allowed(rel, imp) {
					out = append(out, fmt.Sprintf("%s%s imports %s: breaks %q", display(rel), what, imp, r.name))
				}
			}
		}
	}
	for _, p := range pkgs {
		rel, ok := internal(p.ImportPath)
		if !ok {
			out = append(out, fmt.Sprintf("%s: outside module %s", p.ImportPath, module))
			continue
		}
		if !slices.Contains(governed, rel) {
			out = append(out, fmt.Sprintf("%s: new package not placed in the layout: add it to docs/architecture.md's parts and to this test's rules", display(rel)))
		}
		check(layerRules, rel, p.Imports, "")
		check(everywhereRules, rel, p.Imports, "")
		check(everywhereRules, rel, p.TestImports, " (tests)")
		check(everywhereRules, rel, p.XTestImports, " (external tests)")
	}
	sort.Strings(out)
	return slices.Compact(out)
}

func display(rel string) string {
	if rel == "" {
		return "(module root)"
	}
	return rel
}

func TestLayoutImportsPointDown(t *testing.T) {
	pkgs := listPackages(t)
	if len(pkgs) < len(governed)-1 {
		t.Fatalf("go list found %d packages, want at least %d: is the test running from the module root?", len(pkgs), len(governed)-1)
	}
	for _, v := range violations(pkgs) {
		t.Error(v)
	}
}

// TestLayoutRulesBite proves the rules fail on the edges they forbid, so
// that a rule that can never match is caught here rather than trusted.
func TestLayoutRulesBite(t *testing.T) {
	m := func(rel string) string { return module + "/" + rel }
	cases := []struct {
		pkg, imp, rule string
	}{
		{"registry", m("transfer"), "registry is the domain"},
		{"registry/memstore", m("registry/pgstore"), "registry/memstore imports only registry"},
		{"registry/pgstore", m("server"), "registry/pgstore imports only registry, registry/replica (its Broadcaster) and migrations"},
		{"router", m("server"), "router imports only registry, registry/replica, pdproto, httpwire, kvevents and kvindex"},
		{"router", m("registry/pgstore"), "router imports only registry, registry/replica, pdproto, httpwire, kvevents and kvindex"},
		{"router", "github.com/jackc/pgx/v5", "only it, migrations and registrytest's Postgres helpers import pgx"},
		{"transfer", m("router"), "transfer imports only registry"},
		{"transfer/tcp", m("registry/memstore"), "transfer/nixl, transfer/tcp and transfer/cuda import only registry and transfer"},
		{"server", m("router"), "server imports only registry, registry/replica, pdproto, httpwire, server/api and server/api/apiconv"},
		{"web", m("server/api"), "only server, server/api/apiconv, agent, devfleet and cmd/pdplane import it"},
		{"sim", m("server/api"), "only server, server/api/apiconv, agent, devfleet and cmd/pdplane import it"},
		{"server/api/apiconv", m("server"), "server/api/apiconv is the one conversion between the wire and the domain: it imports only registry, registry/replica and server/api"},
		{"agent", m("server"), "agent imports only registry, pdproto (the engines' shapes), server/api, server/api/apiconv and transfer"},
		{"devfleet", m("router"), "devfleet imports only registry, sim, agent and server/api"},
		{"devfleet", m("server"), "devfleet imports only registry, sim, agent and server/api"},
		{"devfleet", m("registry/memstore"), "devfleet imports only registry, sim, agent and server/api"},
		{"sim", m("devfleet"), "nothing but cmd/pdplane (and devfleet's own tests) imports devfleet"},
		{"agent", m("cmd/pdplane"), "nothing imports cmd/..."},
		{"server", m("registry/registrytest"), "production code never imports a <pkg>test package"},
		{"tracing", m("router"), "tracing builds the tracer provider and traces store writes: it imports only registry"},
		{"bench", m("sim"), "bench imports no pdplane package"},
		{"kvindex", m("router"), "kvindex is the router's index of the engines' KV blocks, built from their events: it imports only kvevents"},
	}
	for _, c := range cases {
		got := violations([]listedPackage{{ImportPath: m(c.pkg), Imports: []string{c.imp}}})
		if !slices.ContainsFunc(got, func(v string) bool { return strings.Contains(v, c.rule) }) {
			t.Errorf("%s importing %s: got %q, want a violation naming %q", c.pkg, c.imp, got, c.rule)
		}
	}
	got := violations([]listedPackage{{ImportPath: m("agent"), XTestImports: []string{m("cmd/pdplane")}}})
	if len(got) != 1 || !strings.Contains(got[0], "nothing imports cmd/...") {
		t.Errorf("agent's tests importing cmd/pdplane: got %q, want one violation naming the cmd rule", got)
	}
	got = violations([]listedPackage{{ImportPath: m("interop"), XTestImports: []string{m("devfleet")}}})
	if len(got) != 1 || !strings.Contains(got[0], "imports devfleet") {
		t.Errorf("interop's tests importing devfleet: got %q, want one violation naming the devfleet rule", got)
	}
	got = violations([]listedPackage{{ImportPath: m("devfleet"), XTestImports: []string{m("devfleet")}}})
	if len(got) != 0 {
		t.Errorf("devfleet's own tests importing it: got %q, want no violation", got)
	}
	got = violations([]listedPackage{{ImportPath: m("newthing")}})
	if len(got) != 1 || !strings.Contains(got[0], "not placed in the layout") {
		t.Errorf("an unplaced package: got %q, want it reported", got)
	}
}
