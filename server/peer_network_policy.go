package server

import (
	"fmt"
	"net/netip"
	"net/url"
	"strings"

	"github.com/pdplane/pdplane/registry"
)

// PeerNetworkPolicy decides which addresses a registration may point the
// router and the other engines at. A peer's url and bootstrap_host are
// dialled by every router replica and prefill, so a registration naming a
// cloud metadata service, a link-local address or the unspecified address
// would turn them into a way to reach what nothing in a PD fleet serves.
// Those are refused by default; Allow widens the policy for a fleet that
// really lives on such a network.
//
// Only literal addresses and well-known metadata host names can be judged
// at registration: a DNS name is resolved when it is dialled.
type PeerNetworkPolicy struct {
	// Allow lists networks accepted even where the default refuses them
	// (serve --allow-peer-networks).
	Allow []netip.Prefix
}

// refusedNetworks are the networks no engine of a PD fleet listens on, each
// with why.
var refusedNetworks = []struct {
	prefix netip.Prefix
	why    string
}{
	{netip.MustParsePrefix("0.0.0.0/8"), "the unspecified network"},
	{netip.MustParsePrefix("::/128"), "the unspecified address"},
	{netip.MustParsePrefix("169.254.169.254/32"), "a cloud metadata service"},
	{netip.MustParsePrefix("fd00:ec2::254/128"), "a cloud metadata service"},
	{netip.MustParsePrefix("100.100.100.200/32"), "a cloud metadata service"},
	{netip.MustParsePrefix("169.254.0.0/16"), "link-local"},
	{netip.MustParsePrefix("fe80::/10"), "link-local"},
}

// metadataHosts are the names cloud metadata services answer to.
var metadataHosts = map[string]bool{
	"metadata":                   true,
	"metadata.google.internal":   true,
	"metadata.goog":              true,
	"instance-data":              true,
	"instance-data.ec2.internal": true,
}

// Check refuses a spec whose url or bootstrap_host names a refused address,
// with a *registry.FieldError naming the field.
func (p PeerNetworkPolicy) Check(spec *registry.PeerSpec) error {
	if u, err := url.Parse(spec.URL); err == nil {
		if err := p.checkHost("url", u.Hostname()); err != nil {
			return err
		}
	}
	if spec.BootstrapHost != "" {
		return p.checkHost("bootstrap_host", spec.BootstrapHost)
	}
	return nil
}

func (p PeerNetworkPolicy) checkHost(field, host string) error {
	host = strings.TrimSuffix(strings.ToLower(strings.Trim(host, "[]")), ".")
	if metadataHosts[host] {
		return &registry.FieldError{Field: field, Detail: fmt.Sprintf("%q is a cloud metadata service, which no engine serves; refused", host)}
	}
	addr, err := netip.ParseAddr(host)
	if err != nil {
		return nil // a name: judged by whoever dials it
	}
	addr = addr.Unmap().WithZone("")
	for _, a := range p.Allow {
		if a.Contains(addr) {
			return nil
		}
	}
	for _, n := range refusedNetworks {
		if n.prefix.Contains(addr) {
			return &registry.FieldError{Field: field, Detail: fmt.Sprintf("%s is %s, where no engine listens; refused (serve --allow-peer-networks %s admits it)", addr, n.why, n.prefix)}
		}
	}
	return nil
}

// ParsePeerNetworks parses a comma-separated list of CIDR prefixes (or bare
// addresses) for PeerNetworkPolicy.Allow.
func ParsePeerNetworks(list string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, s := range strings.Split(list, ",") {
		s = strings.TrimSpace(s)
		if s == "" {
			continue
		}
		if !strings.Contains(s, "/") {
			a, err := netip.ParseAddr(s)
			if err != nil {
				return nil, fmt.Errorf("peer network %q: not a CIDR prefix or an address", s)
			}
			out = append(out, netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen()))
			continue
		}
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return nil, fmt.Errorf("peer network %q: %w", s, err)
		}
		out = append(out, p.Masked())
	}
	return out, nil
}
