package server_test

import (
	"errors"
	"testing"

	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/server"
)

func TestPeerNetworkPolicy(t *testing.T) {
	t.Parallel()
	allow, err := server.ParsePeerNetworks("169.254.10.0/24, 10.0.0.0/8")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name      string
		url, boot string
		policy    server.PeerNetworkPolicy
		field     string // "" when accepted
	}{
		{"loopback engine", "http://127.0.0.1:30000", "", server.PeerNetworkPolicy{}, ""},
		{"IPv6 loopback", "http://[::1]:30000", "", server.PeerNetworkPolicy{}, ""},
		{"private address", "http://10.1.2.3:30000", "10.1.2.3", server.PeerNetworkPolicy{}, ""},
		{"DNS name", "http://decode-0.engines.svc:30000", "prefill-0.engines.svc", server.PeerNetworkPolicy{}, ""},
		{"SGLang's fake bootstrap host", "http://10.1.2.3:30000", "2.2.2.2", server.PeerNetworkPolicy{}, ""},
		{"AWS/GCP/Azure metadata", "http://169.254.169.254/latest/meta-data", "", server.PeerNetworkPolicy{}, "url"},
		{"metadata as IPv4-mapped IPv6", "http://[::ffff:169.254.169.254]/", "", server.PeerNetworkPolicy{}, "url"},
		{"AWS IPv6 metadata", "http://[fd00:ec2::254]/", "", server.PeerNetworkPolicy{}, "url"},
		{"GCP metadata name", "http://metadata.google.internal./computeMetadata/v1/", "", server.PeerNetworkPolicy{}, "url"},
		{"link-local", "http://169.254.3.4:30000", "", server.PeerNetworkPolicy{}, "url"},
		{"IPv6 link-local with zone", "http://[fe80::1%25eth0]:30000", "", server.PeerNetworkPolicy{}, "url"},
		{"unspecified", "http://0.0.0.0:30000", "", server.PeerNetworkPolicy{}, "url"},
		{"IPv6 unspecified", "http://[::]:30000", "", server.PeerNetworkPolicy{}, "url"},
		{"bootstrap host at the metadata service", "http://10.1.2.3:30000", "169.254.169.254", server.PeerNetworkPolicy{}, "bootstrap_host"},
		{"link-local, allowed", "http://169.254.10.7:30000", "", server.PeerNetworkPolicy{Allow: allow}, ""},
		{"link-local outside the allowed network", "http://169.254.11.7:30000", "", server.PeerNetworkPolicy{Allow: allow}, "url"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			spec := registry.PeerSpec{URL: tc.url, BootstrapHost: tc.boot}
			err := tc.policy.Check(&spec)
			var fe *registry.FieldError
			switch {
			case tc.field == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.field != "" && (!errors.As(err, &fe) || fe.Field != tc.field):
				t.Fatalf("err = %v, want a FieldError on %s", err, tc.field)
			}
		})
	}
}

func TestParsePeerNetworks(t *testing.T) {
	t.Parallel()
	got, err := server.ParsePeerNetworks(" 169.254.0.0/16 ,fe80::1, ")
	if err != nil || len(got) != 2 || got[0].String() != "169.254.0.0/16" || got[1].String() != "fe80::1/128" {
		t.Fatalf("got %v, %v", got, err)
	}
	if _, err := server.ParsePeerNetworks("169.254.0.0/33"); err == nil {
		t.Fatal("a bad prefix was accepted")
	}
	if _, err := server.ParsePeerNetworks("metadata"); err == nil {
		t.Fatal("a name was accepted as a network")
	}
}
