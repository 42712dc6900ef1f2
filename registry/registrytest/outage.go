package registrytest

import (
	"io"
	"net"
	"net/url"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pdplane/pdplane/registry/pgstore"
)

// Outage is a TCP relay between a store and the test PostgreSQL that a test
// can cut, to give one replica a real database outage without stopping the
// database that other tests share: Cut drops every relayed connection and
// closes every new one at once, as a PostgreSQL that is shutting down or
// restarting does; Restore relays again.
type Outage struct {
	ln     net.Listener
	target string

	mu    sync.Mutex
	cut   bool
	stall bool // new connections are accepted and never answered
	conns map[net.Conn]struct{}
}

// NewOutage starts a relay to the host of dbURL and returns the relay and
// dbURL rewritten to connect through it. It stops when the test ends.
func NewOutage(t testing.TB, dbURL string) (*Outage, string) {
	t.Helper()
	cc, err := pgx.ParseConfig(dbURL)
	if err != nil {
		t.Fatalf("parse database url: %v", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	o := &Outage{ln: ln, target: net.JoinHostPort(cc.Host, strconv.Itoa(int(cc.Port))), conns: map[net.Conn]struct{}{}}
	go o.serve()
	t.Cleanup(func() {
		_ = ln.Close()
		o.Cut()
	})
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatalf("parse database url: %v", err)
	}
	u.Host = ln.Addr().String()
	q := u.Query()
	q.Del("host")
	q.Del("port")
	u.RawQuery = q.Encode()
	return o, u.String()
}

// Cut breaks every relayed connection and refuses new ones until Restore.
func (o *Outage) Cut() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.cut = true
	for c := range o.conns {
		_ = c.Close()
	}
	clear(o.conns)
}

// Stall accepts new connections and never answers them, as a database
// host that drops packets looks to a client (connections already relayed
// keep working) until Restore.
func (o *Outage) Stall() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.stall = true
}

// Restore relays new connections again.
func (o *Outage) Restore() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.cut, o.stall = false, false
}

func (o *Outage) serve() {
	for {
		c, err := o.ln.Accept()
		if err != nil {
			return
		}
		go o.relay(c)
	}
}

func (o *Outage) relay(c net.Conn) {
	o.mu.Lock()
	if o.cut {
		o.mu.Unlock()
		_ = c.Close()
		return
	}
	if o.stall {
		o.conns[c] = struct{}{} // closed by Cut or at the end of the test
		o.mu.Unlock()
		return
	}
	o.mu.Unlock()
	up, err := net.DialTimeout("tcp", o.target, 5*time.Second)
	if err != nil {
		_ = c.Close()
		return
	}
	o.mu.Lock()
	if o.cut {
		o.mu.Unlock()
		_ = c.Close()
		_ = up.Close()
		return
	}
	o.conns[c], o.conns[up] = struct{}{}, struct{}{}
	o.mu.Unlock()
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		done <- struct{}{}
	}
	go pipe(up, c)
	go pipe(c, up)
	<-done
	_ = c.Close()
	_ = up.Close()
	o.mu.Lock()
	delete(o.conns, c)
	delete(o.conns, up)
	o.mu.Unlock()
}

// NewPGStoreWithOutage opens a migrated PostgreSQL store on a fresh schema
// that reaches the database through an Outage relay. It returns the store,
// the relay, and the config of the schema without the relay, so that a test
// can open a second replica that keeps its database while this one loses it.
func NewPGStoreWithOutage(t testing.TB, cfg pgstore.Config) (*pgstore.Store, *Outage, pgstore.Config) {
	t.Helper()
	cfg = onNewSchema(t, cfg)
	o, viaURL := NewOutage(t, cfg.URL)
	relayed := cfg
	relayed.URL = viaURL
	return OpenPGStore(t, relayed), o, cfg
}
