package transfer_test

import (
	"context"
	"errors"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/transfer"
	"github.com/pdplane/pdplane/transfer/nixl"
	"github.com/pdplane/pdplane/transfer/tcp/tcptest"
	"github.com/pdplane/pdplane/transfer/transfertest"
)

func TestMain(m *testing.M) {
	transfertest.UseLoopbackUCX()
	os.Exit(m.Run())
}

// rank is an agent with a KV pool laid out as regions of one host buffer.
type rank struct {
	b    transfer.Backend
	buf  *transfer.HostBuffer
	geom transfer.RankGeometry
}

const (
	regions = 4   // K0 K1 V0 V1
	item    = 512 // bytes per page
	slots   = 16  // pages per region
)

func tcpBackend(t testing.TB, name string) transfer.Backend { return tcptest.New(t, name) }

func nixlBackend(t testing.TB, name string) transfer.Backend {
	t.Helper()
	lib := transfertest.RequireNIXL(t)
	b, err := lib.NewBackend(nixl.Config{AgentName: name, UCXTLS: "tcp"}, zerolog.New(zerolog.NewTestWriter(t)))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func newRank(t *testing.T, f transfertest.Factory, name string) *rank {
	t.Helper()
	b := f(t, name)
	buf, err := transfer.AllocHost(regions * item * slots)
	if err != nil {
		t.Fatal(err)
	}
	r := &rank{b: b, buf: buf, geom: transfer.RankGeometry{AgentName: name}}
	for i := range regions {
		r.geom.KVDataPtrs = append(r.geom.KVDataPtrs, buf.Addr()+uint64(i*item*slots))
		r.geom.KVDataLens = append(r.geom.KVDataLens, item*slots)
		r.geom.KVItemLens = append(r.geom.KVItemLens, item)
		r.geom.KVMemKinds = append(r.geom.KVMemKinds, registry.DRAM)
	}
	for _, l := range r.geom.Regions() {
		if err := b.RegisterMemory(l); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		b.Close()
		buf.Free()
	})
	return r
}

func (r *rank) page(region, page int) []byte {
	off := region*item*slots + page*item
	return r.buf.Bytes()[off : off+item]
}

func (r *rank) peer(t *testing.T, key string, gen int64) transfer.Peer {
	t.Helper()
	md, err := r.b.LocalMetadata()
	if err != nil {
		t.Fatal(err)
	}
	return transfer.Peer{Key: key, AgentName: r.b.AgentName(), Generation: gen, Metadata: md, Geometry: r.geom, AttnTPSize: 1}
}

func newWorker(t *testing.T, p *rank, resolve transfer.ResolveFunc, pool transfer.PoolConfig) *transfer.Worker {
	t.Helper()
	w, err := transfer.NewWorker(transfer.WorkerConfig{
		Source:  transfer.Source{Geometry: p.geom, AttnTPSize: 1},
		Pool:    pool,
		Resolve: resolve,
		Timeout: 20 * time.Second,
	}, p.b, zerolog.New(zerolog.NewTestWriter(t)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	return w
}

func TestWorkerSendsPagesAndFollowsReRegistration(t *testing.T) {
	t.Parallel()
	t.Run("tcp", func(t *testing.T) { t.Parallel(); testWorkerReRegistration(t, tcpBackend) })
	t.Run("nixl", func(t *testing.T) {
		t.Parallel()
		transfertest.RequireNIXL(t)
		testWorkerReRegistration(t, nixlBackend)
	})
}

func testWorkerReRegistration(t *testing.T, f transfertest.Factory) {
	p := newRank(t, f, transfertest.UniqueName("prefill"))
	d1 := newRank(t, f, transfertest.UniqueName("decode-g1"))
	transfertest.Fill(p.buf.Bytes(), 1)
	w := newWorker(t, p, nil, transfer.PoolConfig{})
	ctx := context.Background()

	pages := transfer.Pages{SrcPages: []int{0, 1, 2, 9}, DstPages: []int{3, 4, 5, 15}}
	done := make(chan error, 1)
	if err := w.Submit(transfer.Job{Peer: d1.peer(t, "decode/0", 1), Pages: pages, Notif: "7_kv_0_1_0", Room: 7, Done: func(err error) { done <- err }}); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("send: %v", err)
	}
	transfertest.WaitNotif(t, d1.b, p.b.AgentName(), []byte("7_kv_0_1_0"), 10*time.Second)
	for r := range regions {
		for i, sp := range pages.SrcPages {
			if string(p.page(r, sp)) != string(d1.page(r, pages.DstPages[i])) {
				t.Fatalf("region %d page %d did not land on page %d", r, sp, pages.DstPages[i])
			}
		}
	}
	if agent, gen, ok := w.Cache().Loaded("decode/0"); !ok || agent != d1.b.AgentName() || gen != 1 {
		t.Fatalf("cache holds %s gen %d (%v)", agent, gen, ok)
	}

	// The decode re-registers: fresh agent name, new memory, generation 2.
	d2 := newRank(t, f, transfertest.UniqueName("decode-g2"))
	if err := w.Send(ctx, transfer.Job{Peer: d2.peer(t, "decode/0", 2), Pages: pages, Notif: "8_kv_0_1_0"}); err != nil {
		t.Fatalf("send to generation 2: %v", err)
	}
	transfertest.WaitNotif(t, d2.b, p.b.AgentName(), []byte("8_kv_0_1_0"), 10*time.Second)
	if agent, gen, _ := w.Cache().Loaded("decode/0"); agent != d2.b.AgentName() || gen != 2 {
		t.Fatalf("cache holds %s gen %d after re-registration", agent, gen)
	}
	// The old agent's metadata is gone from the backend.
	if err := p.b.InvalidateRemote(d1.b.AgentName()); !errors.Is(err, transfer.ErrUnknownAgent) {
		t.Fatalf("old generation still loaded: %v", err)
	}
	// A job naming the older generation is refused.
	if err := w.Send(ctx, transfer.Job{Peer: d1.peer(t, "decode/0", 1), Pages: pages}); !errors.Is(err, transfer.ErrStaleGeneration) {
		t.Fatalf("stale generation: %v", err)
	}

	// EvictAll drops every loaded decode; the next job loads it again.
	if keys := w.Cache().Keys(); !slices.Equal(keys, []string{"decode/0"}) {
		t.Fatalf("cache keys %q, want [decode/0]", keys)
	}
	if err := w.Cache().EvictAll(); err != nil {
		t.Fatalf("evict all: %v", err)
	}
	if agent, gen, ok := w.Cache().Loaded("decode/0"); ok {
		t.Fatalf("cache still holds %s gen %d after EvictAll", agent, gen)
	}
	if err := p.b.InvalidateRemote(d2.b.AgentName()); !errors.Is(err, transfer.ErrUnknownAgent) {
		t.Fatalf("evicted generation still loaded: %v", err)
	}
	if err := w.Send(ctx, transfer.Job{Peer: d2.peer(t, "decode/0", 2), Pages: pages, Notif: "9_kv_0_1_0"}); err != nil {
		t.Fatalf("send after EvictAll: %v", err)
	}
	transfertest.WaitNotif(t, d2.b, p.b.AgentName(), []byte("9_kv_0_1_0"), 10*time.Second)
}

func TestWorkerRaisesMissingMemKind(t *testing.T) {
	t.Parallel()
	p := newRank(t, tcpBackend, transfertest.UniqueName("prefill"))
	d := newRank(t, tcpBackend, transfertest.UniqueName("decode"))
	// A registration that went wrong on this side: the destination was
	// accepted but its kind never recorded (what SGLang hits).
	broken := func(src transfer.Source, g transfer.RankGeometry, tp, rank int) (*transfer.Destination, error) {
		return &transfer.Destination{Geometry: g, AttnTPSize: tp, AttnTPRank: rank}, nil
	}
	w := newWorker(t, p, broken, transfer.PoolConfig{})
	done := make(chan error, 1)
	if err := w.Submit(transfer.Job{Peer: d.peer(t, "decode/0", 1), Pages: transfer.Pages{SrcPages: []int{0}, DstPages: []int{0}}, Done: func(err error) { done <- err }}); err != nil {
		t.Fatal(err)
	}
	err := <-done
	var mk *transfer.MissingMemKindError
	if !errors.As(err, &mk) || mk.Error() != "Missing NIXL destination KV memory kind" || mk.Agent != d.b.AgentName() {
		t.Fatalf("got %v, want *MissingMemKindError for %s", err, d.b.AgentName())
	}
}

func TestWorkerRefusesUnresolvableGeometry(t *testing.T) {
	t.Parallel()
	p := newRank(t, tcpBackend, transfertest.UniqueName("prefill"))
	d := newRank(t, tcpBackend, transfertest.UniqueName("decode"))
	w := newWorker(t, p, nil, transfer.PoolConfig{})
	peer := d.peer(t, "decode/0", 1)
	peer.Geometry.KVMemKinds = peer.Geometry.KVMemKinds[:2] // kinds not one per region
	err := w.Send(context.Background(), transfer.Job{Peer: peer, Pages: transfer.Pages{SrcPages: []int{0}, DstPages: []int{0}}})
	var ge *transfer.GeometryError
	if !errors.As(err, &ge) || ge.Field != "kv_mem_kinds" {
		t.Fatalf("got %v, want a geometry error on kv_mem_kinds", err)
	}
	// Nothing stays loaded after the refusal.
	if err := p.b.InvalidateRemote(d.b.AgentName()); !errors.Is(err, transfer.ErrUnknownAgent) {
		t.Fatalf("refused peer left loaded: %v", err)
	}
}

func TestPoolFullQueueIsAnError(t *testing.T) {
	t.Parallel()
	pool, err := transfer.NewPool(transfer.PoolConfig{Workers: 1, QueueSize: 1}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	block := make(chan struct{})
	started := make(chan struct{})
	if err := pool.Submit(0, func() { close(started); <-block }); err != nil {
		t.Fatal(err)
	}
	<-started
	queuedRan := make(chan struct{})
	if err := pool.Submit(0, func() { close(queuedRan) }); err != nil {
		t.Fatalf("queue of one: %v", err)
	}
	if err := pool.Submit(0, func() {}); !errors.Is(err, transfer.ErrQueueFull) {
		t.Fatalf("full queue: got %v, want ErrQueueFull", err)
	}
	close(block)
	pool.Close()
	select {
	case <-queuedRan:
	default:
		t.Fatal("Close returned before the queued task ran")
	}
	if err := pool.Submit(0, func() {}); !errors.Is(err, transfer.ErrClosed) {
		t.Fatalf("closed pool: got %v, want ErrClosed", err)
	}
	pool.Close()
}

func TestPoolKeepsOrderPerKey(t *testing.T) {
	t.Parallel()
	pool, err := transfer.NewPool(transfer.PoolConfig{Workers: 3, QueueSize: 100}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	got := map[uint64][]int{}
	for i := range 90 {
		key := uint64(i % 3)
		if err := pool.Submit(key, func() { mu.Lock(); got[key] = append(got[key], i); mu.Unlock() }); err != nil {
			t.Fatal(err)
		}
	}
	pool.Close() // lets every queued task run and waits for them
	// Every task ran, once, in the order it was submitted for its key.
	for key := range uint64(3) {
		var want []int
		for i := int(key); i < 90; i += 3 {
			want = append(want, i)
		}
		if !slices.Equal(got[key], want) {
			t.Errorf("key %d ran %v, want %v", key, got[key], want)
		}
	}
}

func TestPoolConfigValidate(t *testing.T) {
	t.Parallel()
	if _, err := transfer.NewPool(transfer.PoolConfig{Workers: -1}, zerolog.Nop()); err == nil {
		t.Fatal("negative workers accepted")
	}
}
