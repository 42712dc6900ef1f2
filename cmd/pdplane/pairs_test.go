package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/registry/memstore"
	"github.com/pdplane/pdplane/registry/registrytest"
)

func TestPairsListAndLift(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	store := memstore.New(memstore.Config{QuarantineTTL: time.Hour})
	url, pf, d := startCLIControlPlane(t, ctx, store)
	admin := registry.Claim{Admin: true}
	dspec := registrytest.Spec("d0", registry.RoleDecode)
	report := registry.TransferFailure{DecodeID: d.Peer.ID, PrefillID: pf.Peer.ID, Reason: "transfer failed", Error: "Missing NIXL destination KV memory kind"}
	store.ReportTransferFailure(ctx, report)
	dspec.Ranks[0].AgentName += "-g2"
	store.Register(ctx, dspec, admin)
	if _, out, _ := store.ReportTransferFailure(ctx, report); out != registry.OutcomeQuarantined {
		t.Fatalf("setup: %s", out)
	}

	run := func(args ...string) (string, error) {
		var out bytes.Buffer
		err := pairsCmd(ctx, append(args, "--control-plane", url), &out)
		return out.String(), err
	}
	waitUntil := func(what, sub string, want bool) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for {
			out, err := run("list")
			if err == nil && strings.Contains(out, sub) == want {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: %v\n%s", what, err, out)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	waitUntil("list shows the quarantine", "QUARANTINED until", true)

	if _, err := run("lift", "p0", "d0"); err == nil || !strings.Contains(err.Error(), "401") {
		t.Fatalf("lift without a token: %v", err)
	}
	if _, err := run("lift", "p0", "nope", "--admin-token", "adm"); err == nil || !strings.Contains(err.Error(), `no peer named "nope"`) {
		t.Fatalf("lift with an unknown peer: %v", err)
	}
	if out, err := run("lift", "p0", d.Peer.ID, "--admin-token", "adm"); err != nil || !strings.Contains(out, "lifted") {
		t.Fatalf("lift by name and id: %q %v", out, err)
	}
	waitUntil("list shows the pair routable", "QUARANTINED", false)
	if out, _ := run("list"); !strings.Contains(out, "routable") {
		t.Fatalf("list after lift:\n%s", out)
	}
	if _, err := run("lift", "p0", "d0", "--admin-token", "adm"); err == nil || !strings.Contains(err.Error(), "404") || !strings.Contains(err.Error(), "not quarantined") {
		t.Fatalf("second lift: %v; want the 404 problem's detail", err)
	}
	if _, err := run("bogus"); err == nil {
		t.Fatal("unknown subcommand accepted")
	}
}
