package agent

import (
	"context"
	"fmt"
	"net"
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
		if (u.Scheme != "http" && u.Scheme != "https") || u.Hostname() == "" {
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
//
// A URL whose host is a DNS name with several addresses (a headless
// Service, round-robin DNS) stands for several replicas: each address is
// tried as a replica of its own, in the resolver's order, with the name
// kept as the Host header and the TLS server name. Names are resolved again
// every resolveEvery, and at once after a call that no replica answered.
type controlPlanes struct {
	targets      []*target
	base         *http.Client
	opts         []api.ClientOption // without the HTTP client
	lookup       func(ctx context.Context, host string) ([]string, error)
	resolveEvery time.Duration
	minDown      time.Duration
	maxDown      time.Duration
	now          func() time.Time
	log          zerolog.Logger

	mu   sync.Mutex
	eps  map[string]*endpoint // by URL and pinned address
	last *endpoint            // the replica that answered last
}

// target is one configured URL.
type target struct {
	url        string
	host, port string // host is empty when the URL names an IP address
	// guarded by controlPlanes.mu
	addrs      []string // resolved addresses, when more than one
	resolvedAt time.Time
}

type endpoint struct {
	url    string
	addr   string // the address it is pinned to; empty: dial the URL's host
	client *api.ClientWithResponses
	// guarded by controlPlanes.mu
	downUntil time.Time
	fails     int
}

func (e *endpoint) String() string {
	if e.addr == "" {
		return e.url
	}
	return e.url + " (" + e.addr + ")"
}

func newControlPlanes(cfg Config, opts []api.ClientOption, log zerolog.Logger) (*controlPlanes, error) {
	urls, err := ParseControlPlanes(cfg.ControlPlane)
	if err != nil {
		return nil, err
	}
	c := &controlPlanes{base: cfg.HTTPClient, opts: opts, lookup: cfg.LookupHost, resolveEvery: 30 * time.Second,
		minDown: cfg.FailbackMin, maxDown: cfg.FailbackMax, now: time.Now, log: log, eps: map[string]*endpoint{}}
	for _, raw := range urls {
		u, _ := url.Parse(raw) // parsed above
		t := &target{url: raw}
		if net.ParseIP(u.Hostname()) == nil {
			t.host, t.port = u.Hostname(), u.Port()
			if t.port == "" {
				t.port = map[string]string{"http": "80", "https": "443"}[u.Scheme]
			}
		}
		c.targets = append(c.targets, t)
		if _, err := c.endpoint(raw, ""); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// endpoint returns the endpoint for url pinned to addr (none when addr is
// empty), creating it on first use; the caller may hold mu.
func (c *controlPlanes) endpoint(u, addr string) (*endpoint, error) {
	key := u + "\x00" + addr
	if e, ok := c.eps[key]; ok {
		return e, nil
	}
	hc := c.base
	if addr != "" {
		var ok bool
		if hc, ok = pinned(c.base, addr); !ok {
			return nil, fmt.Errorf("control plane %s: the HTTP client's transport cannot be pinned to an address", u)
		}
	}
	client, err := api.NewClientWithResponses(u, append([]api.ClientOption{api.WithHTTPClient(hc)}, c.opts...)...)
	if err != nil {
		return nil, fmt.Errorf("control plane client for %s: %w", u, err)
	}
	e := &endpoint{url: u, addr: addr, client: client}
	c.eps[key] = e
	return e, nil
}

// pinned returns a copy of base whose connections all go to addr, whatever
// the request's host; the request keeps its Host header and TLS server
// name. It cannot pin a client whose transport is not an *http.Transport.
func pinned(base *http.Client, addr string) (*http.Client, bool) {
	var tr *http.Transport
	switch t := base.Transport.(type) {
	case nil:
		tr = http.DefaultTransport.(*http.Transport).Clone()
	case *http.Transport:
		tr = t.Clone()
	default:
		return nil, false
	}
	dial := tr.DialContext
	if dial == nil {
		dial = (&net.Dialer{}).DialContext
	}
	tr.DialContext = func(ctx context.Context, network, _ string) (net.Conn, error) { return dial(ctx, network, addr) }
	hc := *base
	hc.Transport = tr
	return &hc, true
}

// resolve refreshes the addresses of the targets named by DNS when they are
// due. A failed lookup keeps the previous addresses.
func (c *controlPlanes) resolve(ctx context.Context) {
	now := c.now()
	for _, t := range c.targets {
		if t.host == "" {
			continue
		}
		c.mu.Lock()
		due := t.resolvedAt.IsZero() || now.Sub(t.resolvedAt) >= c.resolveEvery
		c.mu.Unlock()
		if !due {
			continue
		}
		addrs, err := c.lookup(ctx, t.host)
		c.mu.Lock()
		t.resolvedAt = now
		if err != nil {
			c.log.Warn().Err(err).Str("control_plane", t.url).Msg("resolve control-plane name; keeping the addresses known")
		} else {
			t.addrs = t.addrs[:0]
			if len(addrs) > 1 { // one address: the URL's own client dials it
				for _, a := range addrs {
					t.addrs = append(t.addrs, net.JoinHostPort(a, t.port))
				}
			}
		}
		c.mu.Unlock()
	}
}

// order returns the replicas to try: those not marked down in order of
// preference, then those marked down, soonest back first, as a last resort.
func (c *controlPlanes) order(ctx context.Context) []*endpoint {
	c.resolve(ctx)
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.now()
	var up, down []*endpoint
	for _, t := range c.targets {
		var eps []*endpoint
		for _, a := range t.addrs {
			if e, err := c.endpoint(t.url, a); err == nil {
				eps = append(eps, e)
			}
		}
		if len(eps) == 0 {
			e, _ := c.endpoint(t.url, "") // created in newControlPlanes
			eps = append(eps, e)
		}
		for _, e := range eps {
			if now.Before(e.downUntil) {
				down = append(down, e)
			} else {
				up = append(up, e)
			}
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
// fails, it returns the last failure. A positive attempt bounds each try,
// so that a replica that accepts connections but never answers costs that
// long, not the HTTP client's whole timeout.
func (c *controlPlanes) call(ctx context.Context, what string, attempt time.Duration,
	fn func(context.Context, *api.ClientWithResponses) (*http.Response, error)) error {
	var lastErr error
	for _, e := range c.order(ctx) {
		actx, cancel := ctx, context.CancelFunc(func() {})
		if attempt > 0 {
			actx, cancel = context.WithTimeout(ctx, attempt)
		}
		resp, err := fn(actx, e.client)
		cancel()
		if ctx.Err() != nil {
			return ctx.Err()
		}
		switch {
		case err != nil:
			lastErr = fmt.Errorf("%s via %s: %w", what, e, err)
		case resp.StatusCode >= 500:
			lastErr = fmt.Errorf("%s via %s: control plane answered %d", what, e, resp.StatusCode)
		default:
			c.markUp(e)
			return nil
		}
		c.markDown(e, lastErr)
	}
	c.mu.Lock()
	for _, t := range c.targets { // names may point elsewhere now
		t.resolvedAt = time.Time{}
	}
	c.mu.Unlock()
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
		c.log.Warn().Err(err).Str("control_plane", e.String()).Dur("retry_in", d).Msg("control-plane replica failed; using the next one")
	}
}

func (c *controlPlanes) markUp(e *endpoint) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if now := c.now(); now.Before(e.downUntil) {
		// It answered as a last resort, every replica being marked down:
		// what kept them all away (most likely their shared store) is
		// over, so the others get their next try soon rather than after
		// the long pause their failures during the outage earned.
		soon := now.Add(c.minDown)
		for _, o := range c.eps {
			o.fails = 0
			if o.downUntil.After(soon) {
				o.downUntil = soon
			}
		}
	}
	e.fails, e.downUntil = 0, time.Time{}
	if c.last != e && c.last != nil {
		c.log.Info().Str("control_plane", e.String()).Str("previous", c.last.String()).Msg("agent switched control-plane replica")
	}
	c.last = e
}

// current names the replica that answered last: its URL, and the address
// it was reached at when the URL's name has several; empty before any
// answered.
func (c *controlPlanes) current() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.last == nil {
		return ""
	}
	return c.last.String()
}

// callFor is call for one request of the generated client: send makes the
// request, parse (the generated Parse…Response) reads its answer, and the
// parsed answer of the control plane that took the request is returned.
func callFor[R any](ctx context.Context, c *controlPlanes, what string, attempt time.Duration,
	send func(context.Context, *api.ClientWithResponses) (*http.Response, error),
	parse func(*http.Response) (R, error)) (R, error) {
	var answer R
	err := c.call(ctx, what, attempt, func(ctx context.Context, cl *api.ClientWithResponses) (*http.Response, error) {
		resp, err := send(ctx, cl)
		if err != nil {
			return nil, err
		}
		if answer, err = parse(resp); err != nil {
			return nil, err
		}
		return resp, nil
	})
	return answer, err
}
