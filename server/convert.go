package server

import (
	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/server/api"
	"github.com/pdplane/pdplane/server/api/apiconv"
)

// specFromAPI converts a registration body (see apiconv.Spec) and fills in
// its unset optional fields.
func specFromAPI(b *api.PeerRegistration) (registry.PeerSpec, error) {
	s, err := apiconv.Spec(b)
	if err != nil {
		return s, err
	}
	return s.WithDefaults(), nil
}

// timing is what every peer the control plane answers with is told about
// heartbeats and leases.
func (s *Server) timing() apiconv.Timing {
	return apiconv.Timing{HeartbeatInterval: s.cfg.HeartbeatInterval, LeaseTTL: s.cfg.LeaseTTL}
}
