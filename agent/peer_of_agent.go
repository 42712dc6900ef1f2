package agent

import (
	"context"
	"fmt"
	"net/http"

	"github.com/pdplane/pdplane/server/api"
	"github.com/pdplane/pdplane/server/api/apiconv"
)

// PeerOfAgent returns the ID of the registered peer one of whose ranks is
// the NIXL agent agentName. SGLang's bootstrap plane names a decode by its
// agent only, so a prefill that must report a failed transfer, or fetch
// the decode's transfer secret, finds the peer this way. Peers of the
// opposite role are searched (a prefill asks about decodes and the other
// way round); an agent no registered peer has is an error. The registry
// keeps agent names unique across live peers (a second live registrant is
// refused), and a failed peer's ranks are passed over, so that the answer
// is the one peer that registered the agent and still holds it.
//
// Answers are cached (an agent name names one peer for its life), so that a
// burst of failed transfers to one decode costs one listing, not one each.
func (a *Agent) PeerOfAgent(ctx context.Context, agentName string) (string, error) {
	a.mu.Lock()
	id, ok := a.peerByAgent[agentName]
	a.mu.Unlock()
	if ok {
		return id, nil
	}
	role := api.Decode
	if p := a.Peer(); p.Role == api.Decode {
		role = api.Prefill
	}
	auth := a.asPeer()
	resp, err := callFor(ctx, a.cps, "peer of agent "+agentName, 0, func(ctx context.Context, c *api.ClientWithResponses) (*http.Response, error) {
		return c.ListPeers(ctx, &api.ListPeersParams{Role: &role}, auth)
	}, api.ParseListPeersResponse)
	if err != nil {
		return "", err
	}
	if resp.JSON200 == nil {
		return "", fmt.Errorf("peer of agent %s: %w", agentName, refusal(resp.HTTPResponse, resp.Body))
	}
	for _, p := range resp.JSON200.Peers {
		if p.State == api.StateFailed {
			continue
		}
		for _, r := range apiconv.Deref(p.Ranks) {
			if r.AgentName == agentName {
				a.rememberPeer(agentName, p.Id)
				return p.Id, nil
			}
		}
	}
	return "", fmt.Errorf("no registered %s peer has the agent %s", role, agentName)
}

// maxPeerByAgent bounds the cache; it starts over when full.
const maxPeerByAgent = 4096

func (a *Agent) rememberPeer(agentName, id string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.peerByAgent == nil || len(a.peerByAgent) >= maxPeerByAgent {
		a.peerByAgent = map[string]string{}
	}
	a.peerByAgent[agentName] = id
}
