package apiconv_test

import (
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/registry/registrytest"
	"github.com/pdplane/pdplane/server/api"
	"github.com/pdplane/pdplane/server/api/apiconv"
)

// The agent sends Registration and the control plane reads it with Spec:
// together they must give back the spec the agent started from.
func TestRegistrationRoundTrips(t *testing.T) {
	withSecret := registrytest.Spec("d0", registry.RoleDecode)
	withSecret.Labels = map[string]string{"zone": "a"}
	withSecret.Ranks[0].TransferSecret = []byte("secret")
	withSecret.KVEvents = registry.KVEvents{Endpoint: "tcp://10.0.0.1:5557", ReplayEndpoint: "tcp://10.0.0.1:5558", Topic: "kv"}
	for _, spec := range []registry.PeerSpec{
		registrytest.Spec("p0", registry.RolePrefill),
		registrytest.PublishedSpec("d1", registry.RoleDecode),
		withSecret,
	} {
		body := apiconv.Registration(&spec)
		got, err := apiconv.Spec(&body)
		if err != nil {
			t.Fatalf("%s: %v", spec.Name, err)
		}
		if !reflect.DeepEqual(got, spec) {
			t.Errorf("%s: round trip gave\n%+v\nwant\n%+v", spec.Name, got, spec)
		}
	}
}

// PeerSummary copies what it shares with Peer field by field: a field the
// generator adds to both must not be forgotten there.
func TestPeerSummaryCarriesEveryFieldItShares(t *testing.T) {
	lease := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	p := registry.Peer{PeerSpec: registrytest.Spec("p0", registry.RolePrefill), ID: "id", State: registry.StateReady,
		StateReason: "why", Generation: 3, LeaseExpiry: lease, LastHeartbeat: &lease,
		Load: registry.Load{Running: 1, Queued: 2, KVUsage: 0.5}, CreatedAt: lease, UpdatedAt: lease,
		Heal: registry.Heal{Phase: registry.HealVerifying, Reason: "r", FromGeneration: 1, Started: lease, Acted: lease, Deadline: lease}}
	p.Labels = map[string]string{"zone": "a"}
	p.BootstrapHost, p.TransferGroup = "10.0.0.1", "group"
	p.KVEvents = registry.KVEvents{Endpoint: "tcp://10.0.0.1:5557"}
	p.Observed, p.Unknown = []string{registry.FieldNumLayers}, []string{registry.FieldHeadDim}
	timing := apiconv.Timing{HeartbeatInterval: time.Second, LeaseTTL: 5 * time.Second}
	full, sum := reflect.ValueOf(apiconv.Peer(&p, timing)), reflect.ValueOf(apiconv.PeerSummary(&p, timing))
	st := sum.Type()
	for i := range st.NumField() {
		name := st.Field(i).Name
		if name == "Ranks" {
			continue
		}
		f := full.FieldByName(name)
		if !f.IsValid() {
			continue
		}
		if f.IsZero() {
			t.Errorf("the test peer leaves %s empty: give it a value", name)
		}
		if !reflect.DeepEqual(f.Interface(), sum.Field(i).Interface()) {
			t.Errorf("PeerSummary.%s = %v, Peer.%s = %v", name, sum.Field(i).Interface(), name, f.Interface())
		}
	}
	ranks := *apiconv.PeerSummary(&p, timing).Ranks
	if len(ranks) != len(p.Ranks) || ranks[0].KvBytes == 0 || ranks[0].AgentMetadataBytes != len(p.Ranks[0].AgentMetadata) {
		t.Errorf("rank summaries %+v", ranks)
	}
}

// An unknown memory kind is an error naming its field.
func TestSpecNamesTheBadField(t *testing.T) {
	spec := registrytest.Spec("d0", registry.RoleDecode)
	body := apiconv.Registration(&spec)
	(*body.Ranks)[0].KvMemKinds[1] = api.MemKind("HBM")
	_, err := apiconv.Spec(&body)
	var fe *registry.FieldError
	if !errors.As(err, &fe) || fe.Field != "ranks[0].kv_mem_kinds[1]" {
		t.Fatalf("err %v, want a field error on ranks[0].kv_mem_kinds[1]", err)
	}
}
