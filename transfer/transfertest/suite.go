package transfertest

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/transfer"
)

// Factory makes a fresh backend whose agent name is name.
type Factory func(t testing.TB, name string) transfer.Backend

// Options tunes the contract suite.
type Options struct {
	// Sizes are the transfer sizes of the WRITE/READ round trips; default
	// 4 KiB, 64 KiB, 1 MiB, 16 MiB and 64 MiB.
	Sizes []int
	// Timeout bounds every wait of the suite; default 60s.
	Timeout time.Duration
}

// DefaultSizes returns the sizes the suite moves by default.
func DefaultSizes() []int { return []int{4 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20} }

// HandleCounter is implemented by backends that can count the library
// handles they hold (requests, prepared lists); the suite checks that no
// error path leaks one.
type HandleCounter interface {
	OpenHandles() int
}

// UniqueName returns prefix with a random suffix, unique enough for agent
// names across the processes of a test run.
func UniqueName(prefix string) string {
	var b [6]byte
	rand.Read(b[:])
	return fmt.Sprintf("%s-%x", prefix, b)
}

// RunBackendSuite runs the backend contract against newBackend: two agents
// in one process, DRAM to DRAM, WRITE and READ at every size with the bytes
// checked on the far side and notifications received, prepared lists,
// invalidate-and-reload of a re-registered peer, and the error cases (spans
// outside registered memory, unknown agents, malformed and stranger
// metadata, empty and overlapping regions, a peer that vanishes during a
// transfer), each ending with no leaked handle.
func RunBackendSuite(t *testing.T, newBackend Factory, opts Options) {
	if len(opts.Sizes) == 0 {
		opts.Sizes = DefaultSizes()
	}
	if opts.Timeout <= 0 {
		opts.Timeout = 60 * time.Second
	}
	s := &suite{newBackend: newBackend, opts: opts}
	t.Run("WriteReadSizes", s.writeReadSizes)
	t.Run("ScatteredPages", s.scatteredPages)
	t.Run("Prepared", s.prepared)
	t.Run("Concurrent", s.concurrent)
	t.Run("ReRegisteredPeer", s.reRegisteredPeer)
	t.Run("Errors", s.errorCases)
	t.Run("PeerVanishes", s.peerVanishes)
}

type suite struct {
	newBackend Factory
	opts       Options
}

// Agent is a backend with registered host memory, as the suite and the
// two-process harness use it.
type Agent struct {
	B   transfer.Backend     // the backend
	Buf *transfer.HostBuffer // its registered memory
}

// NewAgent creates a backend named name with size bytes of registered host
// memory; cleanup closes the backend and then frees the memory.
func NewAgent(t testing.TB, f Factory, name string, size int) *Agent {
	t.Helper()
	b := f(t, name)
	buf, err := transfer.AllocHost(size)
	if err != nil {
		b.Close()
		t.Fatalf("alloc host memory: %v", err)
	}
	a := &Agent{B: b, Buf: buf}
	t.Cleanup(func() { a.Close(t) })
	if err := b.RegisterMemory(buf.Region()); err != nil {
		t.Fatalf("register %d bytes: %v", size, err)
	}
	return a
}

// Close deregisters the memory, closes the backend and frees the memory.
func (a *Agent) Close(t testing.TB) {
	if a.Buf == nil {
		return
	}
	if err := a.B.DeregisterMemory(a.Buf.Region()); err != nil && !errors.Is(err, transfer.ErrInvalidRegion) && !errors.Is(err, transfer.ErrClosed) {
		t.Errorf("deregister: %v", err)
	}
	if err := a.B.Close(); err != nil {
		t.Errorf("close backend: %v", err)
	}
	if err := a.Buf.Free(); err != nil {
		t.Errorf("free host memory: %v", err)
	}
	a.Buf = nil
}

// Meta returns the agent's metadata or fails the test.
func (a *Agent) Meta(t testing.TB) []byte {
	t.Helper()
	md, err := a.B.LocalMetadata()
	if err != nil {
		t.Fatalf("local metadata of %s: %v", a.B.AgentName(), err)
	}
	return md
}

// Connect loads to's metadata into from, checking the agent name.
func Connect(t testing.TB, from, to *Agent) {
	t.Helper()
	if err := transfer.LoadPeer(from.B, to.B.AgentName(), to.Meta(t)); err != nil {
		t.Fatalf("load metadata of %s into %s: %v", to.B.AgentName(), from.B.AgentName(), err)
	}
}

// WaitNotif drains b's notifications until one from agent with msg arrives.
func WaitNotif(t testing.TB, b transfer.Backend, agent string, msg []byte, timeout time.Duration) {
	t.Helper()
	if err := AwaitNotif(b, agent, msg, timeout); err != nil {
		t.Fatal(err)
	}
}

// AwaitNotif is WaitNotif returning an error instead of failing a test.
// Other notifications drained meanwhile are dropped; use AwaitNotifs to wait
// for several.
func AwaitNotif(b transfer.Backend, agent string, msg []byte, timeout time.Duration) error {
	return AwaitNotifs(b, timeout, transfer.Notif{Agent: agent, Msg: msg})
}

// AwaitNotifs drains b's notifications until every one of want has
// arrived, in any order.
func AwaitNotifs(b transfer.Backend, timeout time.Duration, want ...transfer.Notif) error {
	deadline := time.Now().Add(timeout)
	missing := append([]transfer.Notif(nil), want...)
	var seen []transfer.Notif
	for {
		ns, err := b.GetNotifs()
		if err != nil {
			return fmt.Errorf("get notifications: %w", err)
		}
		for _, n := range ns {
			found := false
			for i, w := range missing {
				if n.Agent == w.Agent && bytes.Equal(n.Msg, w.Msg) {
					missing = append(missing[:i], missing[i+1:]...)
					found = true
					break
				}
			}
			if !found {
				seen = append(seen, n)
			}
		}
		if len(missing) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("notifications %v not received within %s (saw %d others: %v)", missing, timeout, len(seen), seen)
		}
		time.Sleep(200 * time.Microsecond)
	}
}

func checkHandles(t testing.TB, as ...*Agent) {
	t.Helper()
	for _, a := range as {
		if hc, ok := a.B.(HandleCounter); ok {
			deadline := time.Now().Add(5 * time.Second)
			for hc.OpenHandles() != 0 && time.Now().Before(deadline) {
				time.Sleep(time.Millisecond)
			}
			if n := hc.OpenHandles(); n != 0 {
				t.Errorf("%s holds %d handles after the case", a.B.AgentName(), n)
			}
		}
	}
}

func (s *suite) ctx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), s.opts.Timeout)
	t.Cleanup(cancel)
	return ctx
}

func span(a *Agent, off, n int) transfer.DescList {
	return transfer.DescList{Kind: registry.DRAM, Descs: []transfer.Desc{a.Buf.Span(off, n)}}
}

// connected makes agents a and b with buffers of aSize and bSize bytes and
// loads b's metadata into a.
func (s *suite) connected(t *testing.T, aSize, bSize int) (a, b *Agent) {
	t.Helper()
	a = NewAgent(t, s.newBackend, UniqueName("a"), aSize)
	b = NewAgent(t, s.newBackend, UniqueName("b"), bSize)
	Connect(t, a, b)
	return a, b
}

// checkLanded fails the test unless page j (of page bytes) of b's buffer
// holds what page i of a's does.
func checkLanded(t *testing.T, a, b *Agent, page, i, j int) {
	t.Helper()
	if !bytes.Equal(a.Buf.Bytes()[i*page:(i+1)*page], b.Buf.Bytes()[j*page:(j+1)*page]) {
		t.Fatalf("page %d did not land on page %d", i, j)
	}
}

// pageLists lists pages pages of page bytes in a's buffer and, in the same
// order, the pages of b's they go to: page i to page to(i).
func pageLists(a, b *Agent, page, pages int, to func(i int) int) (l, d transfer.DescList) {
	l.Kind, d.Kind = registry.DRAM, registry.DRAM
	for i := range pages {
		l.Descs = append(l.Descs, a.Buf.Span(i*page, page))
		d.Descs = append(d.Descs, b.Buf.Span(to(i)*page, page))
	}
	return l, d
}

// writeReadSizes: WRITE A's first half into B, check B's bytes and
// notification; READ it back into A's second half, check A's bytes and B's
// notification.
func (s *suite) writeReadSizes(t *testing.T) {
	for _, size := range s.opts.Sizes {
		t.Run(fmt.Sprintf("%dKiB", size>>10), func(t *testing.T) {
			a, b := s.connected(t, 2*size, size)
			ctx := s.ctx(t)
			seed := uint64(size)
			Fill(a.Buf.Bytes()[:size], seed)

			wmsg := []byte(fmt.Sprintf("w-%d", size))
			if err := transfer.Do(ctx, a.B, transfer.Xfer{Op: transfer.OpWrite, Remote: b.B.AgentName(), Local: span(a, 0, size), Dst: span(b, 0, size), Notif: wmsg}); err != nil {
				t.Fatalf("WRITE %d bytes: %v", size, err)
			}
			WaitNotif(t, b.B, a.B.AgentName(), wmsg, s.opts.Timeout)
			if err := Verify(b.Buf.Bytes(), seed); err != nil {
				t.Fatalf("after WRITE: %v", err)
			}

			rmsg := []byte(fmt.Sprintf("r-%d", size))
			if err := transfer.Do(ctx, a.B, transfer.Xfer{Op: transfer.OpRead, Remote: b.B.AgentName(), Local: span(a, size, size), Dst: span(b, 0, size), Notif: rmsg}); err != nil {
				t.Fatalf("READ %d bytes: %v", size, err)
			}
			if err := Verify(a.Buf.Bytes()[size:], seed); err != nil {
				t.Fatalf("after READ: %v", err)
			}
			WaitNotif(t, b.B, a.B.AgentName(), rmsg, s.opts.Timeout)

			// A drain clears: nothing is delivered twice.
			ns, err := b.B.GetNotifs()
			if err != nil {
				t.Fatal(err)
			}
			for _, n := range ns {
				if bytes.Equal(n.Msg, wmsg) || bytes.Equal(n.Msg, rmsg) {
					t.Fatalf("notification %q delivered twice", n.Msg)
				}
			}
			checkHandles(t, a, b)
		})
	}
}

// scatteredPages: many small spans in a scattered order, as KV pages are.
func (s *suite) scatteredPages(t *testing.T) {
	t.Parallel()
	const page, pages = 4 << 10, 64
	a, b := s.connected(t, page*pages, page*pages)
	Fill(a.Buf.Bytes(), 7)
	scatter := func(i int) int { return (i*37 + 11) % pages } // a permutation of the pages
	l, d := pageLists(a, b, page, pages, scatter)
	if err := transfer.Do(s.ctx(t), a.B, transfer.Xfer{Op: transfer.OpWrite, Remote: b.B.AgentName(), Local: l, Dst: d, Notif: []byte("scatter")}); err != nil {
		t.Fatalf("scattered WRITE: %v", err)
	}
	WaitNotif(t, b.B, a.B.AgentName(), []byte("scatter"), s.opts.Timeout)
	for i := range pages {
		checkLanded(t, a, b, page, i, scatter(i))
	}
	checkHandles(t, a, b)
}

// prepared: lists prepared once, transfers by index, WRITE and READ.
func (s *suite) prepared(t *testing.T) {
	t.Parallel()
	const page, pages = 8 << 10, 32
	a, b := s.connected(t, page*pages*2, page*pages)
	Fill(a.Buf.Bytes()[:page*pages], 99)
	l, d := pageLists(a, b, page, pages, func(i int) int { return i })
	p, err := a.B.Prepare(b.B.AgentName(), l, d)
	if err != nil {
		t.Fatalf("prepare: %v", err)
	}
	ctx := s.ctx(t)
	// Pages 3..9 to pages 20..26, and page 0 to page 31.
	li := []int{3, 4, 5, 6, 7, 8, 9, 0}
	ri := []int{20, 21, 22, 23, 24, 25, 26, 31}
	r, err := p.Post(ctx, transfer.OpWrite, li, ri, []byte("prepped"))
	if err != nil {
		t.Fatalf("prepared WRITE: %v", err)
	}
	if err := r.Wait(ctx); err != nil {
		t.Fatalf("prepared WRITE: %v", err)
	}
	WaitNotif(t, b.B, a.B.AgentName(), []byte("prepped"), s.opts.Timeout)
	for k := range li {
		checkLanded(t, a, b, page, li[k], ri[k])
	}
	if _, err := p.Post(ctx, transfer.OpWrite, []int{0}, []int{pages}, nil); !errors.Is(err, transfer.ErrOutOfRange) {
		t.Fatalf("index past the prepared list: got %v, want ErrOutOfRange", err)
	}
	if err := p.Release(); err != nil {
		t.Fatalf("release: %v", err)
	}
	if err := p.Release(); err != nil {
		t.Fatalf("second release: %v", err)
	}
	checkHandles(t, a, b)
}

// concurrent: several goroutines transfer to one remote at once.
func (s *suite) concurrent(t *testing.T) {
	t.Parallel()
	const chunk, n = 256 << 10, 8
	a, b := s.connected(t, chunk*n, chunk*n)
	Fill(a.Buf.Bytes(), 3)
	ctx := s.ctx(t)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	want := make([]transfer.Notif, n)
	for i := range n {
		msg := []byte(fmt.Sprintf("c%d", i))
		want[i] = transfer.Notif{Agent: a.B.AgentName(), Msg: msg}
		wg.Go(func() {
			errs <- transfer.Do(ctx, a.B, transfer.Xfer{Op: transfer.OpWrite, Remote: b.B.AgentName(), Local: span(a, i*chunk, chunk), Dst: span(b, i*chunk, chunk), Notif: msg})
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("concurrent WRITE: %v", err)
		}
	}
	if err := AwaitNotifs(b.B, s.opts.Timeout, want...); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a.Buf.Bytes(), b.Buf.Bytes()) {
		t.Fatal("bytes differ after concurrent WRITEs")
	}
	checkHandles(t, a, b)
}

// reRegisteredPeer: the peer comes back as a new agent (fresh name, new
// memory); the old one is invalidated and the new one loaded.
func (s *suite) reRegisteredPeer(t *testing.T) {
	t.Parallel()
	const size = 1 << 20
	a := NewAgent(t, s.newBackend, UniqueName("a"), size)
	b := NewAgent(t, s.newBackend, UniqueName("b-gen1"), size)
	Connect(t, a, b)
	Fill(a.Buf.Bytes(), 11)
	ctx := s.ctx(t)
	oldName := b.B.AgentName()
	if err := transfer.Do(ctx, a.B, transfer.Xfer{Op: transfer.OpWrite, Remote: oldName, Local: span(a, 0, size), Dst: span(b, 0, size), Notif: []byte("gen1")}); err != nil {
		t.Fatalf("WRITE to generation 1: %v", err)
	}
	WaitNotif(t, b.B, a.B.AgentName(), []byte("gen1"), s.opts.Timeout)
	oldDst := span(b, 0, size)
	b.Close(t)

	b2 := NewAgent(t, s.newBackend, UniqueName("b-gen2"), size)
	if err := a.B.InvalidateRemote(oldName); err != nil {
		t.Fatalf("invalidate %s: %v", oldName, err)
	}
	Connect(t, a, b2)
	Fill(a.Buf.Bytes(), 12)
	if err := transfer.Do(ctx, a.B, transfer.Xfer{Op: transfer.OpWrite, Remote: b2.B.AgentName(), Local: span(a, 0, size), Dst: span(b2, 0, size), Notif: []byte("gen2")}); err != nil {
		t.Fatalf("WRITE to generation 2: %v", err)
	}
	WaitNotif(t, b2.B, a.B.AgentName(), []byte("gen2"), s.opts.Timeout)
	if err := Verify(b2.Buf.Bytes(), 12); err != nil {
		t.Fatalf("generation 2 bytes: %v", err)
	}
	err := transfer.Do(ctx, a.B, transfer.Xfer{Op: transfer.OpWrite, Remote: oldName, Local: span(a, 0, size), Dst: oldDst})
	if !errors.Is(err, transfer.ErrUnknownAgent) {
		t.Fatalf("WRITE to the invalidated agent: got %v, want ErrUnknownAgent", err)
	}
	if err := a.B.InvalidateRemote(oldName); !errors.Is(err, transfer.ErrUnknownAgent) {
		t.Fatalf("second invalidation: got %v, want ErrUnknownAgent", err)
	}
	checkHandles(t, a, b2)
}

func (s *suite) errorCases(t *testing.T) {
	t.Parallel()
	const size = 64 << 10
	a, b := s.connected(t, size, size)
	c := NewAgent(t, s.newBackend, UniqueName("c"), size)
	ctx := s.ctx(t)
	bName := b.B.AgentName()
	write := func(local, dst transfer.DescList, remote string) error {
		return transfer.Do(ctx, a.B, transfer.Xfer{Op: transfer.OpWrite, Remote: remote, Local: local, Dst: dst, Notif: []byte("x")})
	}
	read := func(local, dst transfer.DescList, remote string) error {
		return transfer.Do(ctx, a.B, transfer.Xfer{Op: transfer.OpRead, Remote: remote, Local: local, Dst: dst})
	}
	past := func(ag *Agent, n int) transfer.DescList {
		return transfer.DescList{Kind: registry.DRAM, Descs: []transfer.Desc{{Addr: ag.Buf.Addr() + size - uint64(n)/2, Len: uint64(n)}}}
	}
	cases := []struct {
		name string
		err  error
		want error
	}{
		{"local span past the region", write(past(a, 4096), span(b, 0, 4096), bName), transfer.ErrOutOfRange},
		{"remote span past the region", write(span(a, 0, 4096), past(b, 4096), bName), transfer.ErrOutOfRange},
		{"READ into a local span past the region", read(past(a, 4096), span(b, 0, 4096), bName), transfer.ErrOutOfRange},
		{"READ from a remote span past the region", read(span(a, 0, 4096), past(b, 4096), bName), transfer.ErrOutOfRange},
		{"unregistered local memory", write(span(c, 0, 4096), span(b, 0, 4096), bName), transfer.ErrOutOfRange},
		{"unknown remote agent", write(span(a, 0, 4096), span(b, 0, 4096), "nobody"), transfer.ErrUnknownAgent},
		{"remote agent never loaded", write(span(a, 0, 4096), span(c, 0, 4096), c.B.AgentName()), transfer.ErrUnknownAgent},
		{"span counts differ", transfer.Do(ctx, a.B, transfer.Xfer{Op: transfer.OpWrite, Remote: bName, Local: span(a, 0, 4096), Dst: transfer.DescList{Kind: registry.DRAM, Descs: []transfer.Desc{b.Buf.Span(0, 2048), b.Buf.Span(2048, 2048)}}}), transfer.ErrInvalidDescs},
		{"malformed metadata", func() error { _, err := a.B.LoadRemoteMetadata([]byte("not metadata at all")); return err }(), transfer.ErrBadMetadata},
		{"empty metadata", func() error { _, err := a.B.LoadRemoteMetadata(nil); return err }(), transfer.ErrBadMetadata},
		{"metadata from a stranger", transfer.LoadPeer(a.B, "someone-else", c.Meta(t)), transfer.ErrStranger},
		{"stranger not kept", write(span(a, 0, 4096), span(c, 0, 4096), c.B.AgentName()), transfer.ErrUnknownAgent},
		{"zero-length region", a.B.RegisterMemory(transfer.DescList{Kind: registry.DRAM, Descs: []transfer.Desc{{Addr: c.Buf.Addr(), Len: 0}}}), transfer.ErrInvalidRegion},
		{"overlapping region", a.B.RegisterMemory(span(a, 4096, 4096)), transfer.ErrOverlap},
		{"overlapping regions in one list", b.B.RegisterMemory(transfer.DescList{Kind: registry.DRAM, Descs: []transfer.Desc{c.Buf.Span(0, 8192), c.Buf.Span(4096, 8192)}}), transfer.ErrOverlap},
		{"deregister what was never registered", a.B.DeregisterMemory(span(c, 0, 4096)), transfer.ErrInvalidRegion},
	}
	for _, tc := range cases {
		if !errors.Is(tc.err, tc.want) {
			t.Errorf("%s: got %v, want %v", tc.name, tc.err, tc.want)
		}
	}
	// An agent's own metadata is refused; NIXL does so without saying
	// whose it is, hence either class.
	if err := transfer.LoadPeer(a.B, a.B.AgentName(), a.Meta(t)); !errors.Is(err, transfer.ErrStranger) && !errors.Is(err, transfer.ErrBadMetadata) {
		t.Errorf("own metadata: got %v, want ErrStranger or ErrBadMetadata", err)
	}
	// Nothing above broke the pair.
	Fill(a.Buf.Bytes(), 5)
	if err := write(span(a, 0, size), span(b, 0, size), bName); err != nil {
		t.Fatalf("WRITE after the error cases: %v", err)
	}
	WaitNotif(t, b.B, a.B.AgentName(), []byte("x"), s.opts.Timeout)
	if err := Verify(b.Buf.Bytes(), 5); err != nil {
		t.Fatal(err)
	}
	checkHandles(t, a, b, c)
}

// peerVanishes: the remote closes while a large WRITE is in flight. The
// WRITE either completes or fails with a typed error; later transfers fail
// with ErrPeerGone (or ErrUnknownAgent once invalidated); nothing leaks.
func (s *suite) peerVanishes(t *testing.T) {
	t.Parallel()
	const size = 32 << 20
	a, b := s.connected(t, size, size)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	bName := b.B.AgentName()
	dst := span(b, 0, size)
	r, err := a.B.Post(ctx, transfer.Xfer{Op: transfer.OpWrite, Remote: bName, Local: span(a, 0, size), Dst: dst, Notif: []byte("doomed")})
	if err != nil {
		t.Fatalf("post: %v", err)
	}
	// b's memory stays mapped until its cleanup; closing the backend is what
	// "vanishing" means to a.
	if err := b.B.Close(); err != nil {
		t.Fatalf("close the remote: %v", err)
	}
	if err := r.Wait(ctx); err != nil && !typed(err) {
		t.Fatalf("in-flight WRITE: untyped error %v", err)
	}
	err = transfer.Do(ctx, a.B, transfer.Xfer{Op: transfer.OpWrite, Remote: bName, Local: span(a, 0, 4096), Dst: span(b, 0, 4096)})
	if err == nil {
		t.Fatal("WRITE to a closed agent succeeded")
	}
	if !errors.Is(err, transfer.ErrPeerGone) {
		t.Fatalf("WRITE to a closed agent: got %v, want ErrPeerGone", err)
	}
	if err := a.B.InvalidateRemote(bName); err != nil {
		t.Fatalf("invalidate the vanished agent: %v", err)
	}
	checkHandles(t, a)
}

func typed(err error) bool {
	for _, e := range []error{transfer.ErrPeerGone, transfer.ErrUnknownAgent, context.DeadlineExceeded, context.Canceled} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}
