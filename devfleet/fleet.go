package devfleet

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/rs/zerolog"

	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/sim"
)

// Config is a fleet of simulated prefills and decodes.
type Config struct {
	// ControlPlanes are the base URLs the agents register with, spread
	// over the engines as hosts would be: engine i (prefills first)
	// registers with ControlPlanes[i%len(ControlPlanes)]. An entry may
	// list several replicas separated by commas (failover in order).
	ControlPlanes []string
	// JoinToken admits the peers (the control plane's join or admin token).
	JoinToken string
	// Prefills and Decodes are how many engines of each role start.
	Prefills, Decodes int
	// Sim is the configuration every simulator starts from; Name and Role
	// are set per engine: prefill-0, prefill-1, ..., decode-0, ...
	Sim sim.Config
}

func (c Config) validate() error {
	if len(c.ControlPlanes) == 0 {
		return errors.New("devfleet: ControlPlanes is required")
	}
	if c.Prefills < 0 || c.Decodes < 0 {
		return fmt.Errorf("devfleet: Prefills (%d) and Decodes (%d) must not be negative", c.Prefills, c.Decodes)
	}
	return nil
}

// Fleet is a set of running simulated engines with their agents.
type Fleet struct {
	engines []*Engine
}

// Start starts the fleet's engines and their agents, which run until ctx
// ends or Close. On an error it closes what it started.
func Start(ctx context.Context, cfg Config, log zerolog.Logger) (*Fleet, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	f := &Fleet{}
	for i := 0; i < cfg.Prefills+cfg.Decodes; i++ {
		role, n := registry.RolePrefill, i
		if i >= cfg.Prefills {
			role, n = registry.RoleDecode, i-cfg.Prefills
		}
		sc := cfg.Sim
		sc.Name, sc.Role = fmt.Sprintf("%s-%d", role, n), role
		e, err := StartEngine(ctx, EngineConfig{
			Sim: sc, ControlPlane: cfg.ControlPlanes[i%len(cfg.ControlPlanes)], JoinToken: cfg.JoinToken,
		}, log)
		if err != nil {
			f.Close()
			return nil, err
		}
		f.engines = append(f.engines, e)
	}
	return f, nil
}

// Engines returns the engines in the order they started: the prefills,
// then the decodes.
func (f *Fleet) Engines() []*Engine { return f.engines }

// Engine returns the engine named name, or nil.
func (f *Fleet) Engine(name string) *Engine {
	for _, e := range f.engines {
		if e.Sim().Config().Name == name {
			return e
		}
	}
	return nil
}

// Shutdown closes the fleet gracefully: it waits until no engine has a
// generation request running or queued, or until ctx ends, then closes
// every engine (Close) and returns how many requests that cut. The
// agents go on heartbeating meanwhile, so the peers stay routable for
// what is in flight.
func (f *Fleet) Shutdown(ctx context.Context) int {
	t := time.NewTicker(shutdownPoll)
	defer t.Stop()
	for f.inFlight() > 0 {
		select {
		case <-ctx.Done():
			cut := f.inFlight()
			f.Close()
			return cut
		case <-t.C:
		}
	}
	f.Close()
	return 0
}

// shutdownPoll is how often Shutdown looks whether the engines are idle.
const shutdownPoll = 20 * time.Millisecond

// inFlight is the generation requests running or queued on the engines.
func (f *Fleet) inFlight() int {
	n := 0
	for _, e := range f.engines {
		st := e.Sim().Stats()
		n += st.Running + st.Queued
	}
	return n
}

// Close stops every agent and closes every simulator.
func (f *Fleet) Close() {
	for _, e := range f.engines {
		e.Close()
	}
}

// readyPoll is how often WaitReady asks again.
const readyPoll = 50 * time.Millisecond

// WaitReady waits until the control plane at baseURL answers GET /readyz
// with 200 (it has a routable pair), and fails when timeout passes or ctx
// ends first.
func WaitReady(ctx context.Context, baseURL string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	url := baseURL + "/readyz"
	t := time.NewTicker(readyPoll)
	defer t.Stop()
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("GET %s: %s", url, resp.Status)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for %s: %w (last: %v)", url, ctx.Err(), err)
		case <-t.C:
		}
	}
}
