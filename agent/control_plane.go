package agent

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/pdplane/pdplane/server/api"
)

// ParseControlPlanes splits a --control-plane value, one URL or several
// separated by commas, and checks each: an http or https URL with a host.
// The order is the order of preference.
func ParseControlPlanes(list string) ([]string, error) {
	var out []string
	for i, raw := range strings.Split(list, ",") {
		raw = strings.TrimSpace(raw)
		if raw == "" {
			continue
		}
		u, err := url.Parse(raw)
		if err != nil {
			return nil, fmt.Errorf("control plane URL %d %q: %w", i+1, raw, err)
		}
		if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, fmt.Errorf("control plane URL %d %q: want http://HOST[:PORT] or https://HOST[:PORT]", i+1, raw)
		}
		out = append(out, strings.TrimRight(raw, "/"))
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("control plane URL is required")
	}
	return out, nil
}

// controlPlanes is the agent's view of the control-plane replicas it was
// given, in order of preference. Every call goes to the first replica that
// is not known to be down; a replica that refuses the connection or
// answers 5xx (503: its store is away) is marked down for a while and the
// call moves on to the next, so an agent keeps its lease alive through any
// replica that can write it. A replica marked down is tried again once its
// time is up, so the agent fails back to the one it prefers.
type controlPlanes struct {
	eps     []*endpoint
	minDown time.Duration
	maxDown time.Duration
	now     func() time.Time
	log     zerolog.Logger

	mu   sync.Mutex
	last *endpoint // the replica that answered last
}

type endpoint struct {
	url    string
	client *api.ClientWithResponses
	// guarded by controlPlanes.mu
	downUntil time.Time
	fails     int
}

func newControlPlanes(urls []string, opts []api.ClientOption, minDown, maxDown time.Duration, log zerolog.Logger) (*controlPlanes, error) {
	c := &controlPlanes{minDown: minDown, maxDown: maxDown, now: time.Now, log: log}
	for _, u := range urls {
		client, err := api.NewClientWithResponses(u, opts...)
		if err != nil {
			return nil, fmt.Errorf("control plane client for %s: %w", u, err)
		}
		c.eps = append(c.eps, &endpoint{url: u, client: client})
	}
	return c, nil
}

// order returns the replicas to try: those not marked down in order of
// preference, then those marked down, soonest back first, as a last resort.
func (c *controlPlanes) order() []*endpoint {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.now()
	up := make([]*endpoint, 0, len(c.eps))
	var down []*endpoint
	for _, e := range c.eps {
		if now.Before(e.downUntil) {
			down = append(down, e)
		} else {
			up = append(up, e)
		}
	}
	for i := 1; i < len(down); i++ { // a handful of replicas: insertion sort
		for j := i; j > 0 && down[j].downUntil.Before(down[j-1].downUntil); j-- {
			down[j], down[j-1] = down[j-1], down[j]
		}
	}
	return append(up, down...)
}

// call runs fn against one replica after another until one answers with
// something other than a connection error or a 5xx, and returns that
// answer's error (nil when fn's answer is to be used). When every replica
// fails, it returns the last failure.
func (c *controlPlanes) call(ctx context.Context, what string, fn func(*api.ClientWithResponses) (*http.Response, error)) error {
	var lastErr error
	for _, e := range c.order() {
		resp, err := fn(e.client)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		switch {
		case err != nil:
			lastErr = fmt.Errorf("%s via %s: %w", what, e.url, err)
		case resp.StatusCode >= 500:
			lastErr = fmt.Errorf("%s via %s: control plane answered %d", what, e.url, resp.StatusCode)
		default:
			c.markUp(e)
			return nil
		}
		c.markDown(e, lastErr)
	}
	return lastErr
}

func (c *controlPlanes) markDown(e *endpoint, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e.fails++
	d := c.minDown << min(e.fails-1, 16)
	if d <= 0 || d > c.maxDown {
		d = c.maxDown
	}
	e.downUntil = c.now().Add(d)
	if len(c.eps) > 1 {
		c.log.Warn().Err(err).Str("control_plane", e.url).Dur("retry_in", d).Msg("control-plane replica failed; using the next one")
	}
}

func (c *controlPlanes) markUp(e *endpoint) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e.fails, e.downUntil = 0, time.Time{}
	if c.last != e && c.last != nil {
		c.log.Info().Str("control_plane", e.url).Str("previous", c.last.url).Msg("agent switched control-plane replica")
	}
	c.last = e
}

// current is the URL of the replica that answered last; empty before any
// answered.
func (c *controlPlanes) current() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.last == nil {
		return ""
	}
	return c.last.url
}
