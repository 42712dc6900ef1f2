package kvindex

import (
	"encoding/binary"
	"fmt"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pdplane/pdplane/kvevents"
)

// envFleet sizes BenchmarkFleet as ENGINESxBLOCKS; 100x10000 by default.
// The full size, 1000x100000, holds 10^8 blocks and needs some 9 GB.
const envFleet = "PDPLANE_KVINDEX_FLEET"

// matcher is what BenchmarkFleet measures of a layout.
type matcher interface {
	Apply(kvevents.Batch) error
	Match(keys []uint64) int
}

var layouts = []struct {
	name string
	new  func(max int) matcher
}{
	{"keyset", func(max int) matcher { return newEngine(Config{MaxBlocks: max}) }},
	{"maps", func(max int) matcher { return newMapsEngine(max) }},
}

const (
	fleetBlockSize = 16
	chainBlocks    = 128 // blocks of one filler prompt
	eventBlocks    = 16  // blocks of one BlockStored event
	fewEngines     = 4   // engines that hold the whole request
)

// A fleet holds, on every engine, the 16 blocks of a shared prefix; on
// fewEngines of them, the 32 blocks of the request; and filler prompts up
// to its size.
type fleet struct {
	engines  []matcher
	request  []uint64 // 32 keys, held by fewEngines engines
	shared   []uint64 // 32 keys, the first 16 held by every engine
	perBlock int
}

// chainWriter stores one engine's prompts as vLLM would: events of
// eventBlocks blocks, each chained from the previous one's last block.
type chainWriter struct {
	m      matcher
	engine int
	next   uint64 // engine hashes, counted
	events []kvevents.Event
}

func (w *chainWriter) hash() kvevents.Hash {
	w.next++
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], uint64(w.engine)<<40|w.next)
	return kvevents.Hash(b[:])
}

// store applies one prompt's blocks, as one batch.
func (w *chainWriter) store(tokens []int32) error {
	w.events = w.events[:0]
	parent := kvevents.Hash("")
	for len(tokens) > 0 {
		n := min(eventBlocks, len(tokens)/fleetBlockSize)
		hashes := make([]kvevents.Hash, n)
		for i := range hashes {
			hashes[i] = w.hash()
		}
		w.events = append(w.events, kvevents.Event{Kind: kvevents.BlockStored, BlockHashes: hashes, ParentHash: parent,
			TokenIDs: tokens[:n*fleetBlockSize], BlockSize: fleetBlockSize, Medium: "GPU"})
		parent = hashes[n-1]
		tokens = tokens[n*fleetBlockSize:]
	}
	return w.m.Apply(kvevents.Batch{Events: w.events})
}

// fillerTokens writes the tokens of an engine's n-th filler prompt.
func fillerTokens(dst []int32, engine, n int) {
	for i := range dst {
		dst[i] = int32((engine*7919 + n*chainBlocks*fleetBlockSize + i) & 0x3fffffff)
	}
}

func buildFleet(b *testing.B, newM func(int) matcher, engines, blocks int) *fleet {
	shared := make([]int32, 32*fleetBlockSize)
	request := make([]int32, 32*fleetBlockSize)
	for i := range shared {
		shared[i] = int32(1<<30 + i)
		request[i] = int32(1<<30 + 1<<20 + i)
	}
	f := &fleet{
		engines:  make([]matcher, engines),
		request:  Keys(nil, request, fleetBlockSize),
		shared:   Keys(nil, shared, fleetBlockSize),
		perBlock: blocks,
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, runtime.GOMAXPROCS(0))
	for range runtime.GOMAXPROCS(0) {
		wg.Go(func() {
			tokens := make([]int32, chainBlocks*fleetBlockSize)
			for {
				i := int(next.Add(1) - 1)
				if i >= engines {
					return
				}
				w := &chainWriter{m: newM(blocks + 64), engine: i}
				f.engines[i] = w.m
				held := 16
				err := w.store(shared[:16*fleetBlockSize])
				if err == nil && i%(engines/fewEngines) == 0 {
					err = w.store(request)
					held += 32
				}
				for n := 0; err == nil && held < blocks; n++ {
					k := min(chainBlocks, blocks-held)
					fillerTokens(tokens[:k*fleetBlockSize], i, n)
					err = w.store(tokens[:k*fleetBlockSize])
					held += k
				}
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		b.Fatal(err)
	}
	return f
}

func fleetSize(b *testing.B) (engines, blocks int) {
	engines, blocks = 100, 10_000
	if s := os.Getenv(envFleet); s != "" {
		if _, err := fmt.Sscanf(s, "%dx%d", &engines, &blocks); err != nil || engines < fewEngines || blocks < 64 {
			b.Fatalf("%s=%q: want ENGINESxBLOCKS, at least %dx64", envFleet, s, fewEngines)
		}
	}
	return engines, blocks
}

func heap() runtime.MemStats {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m
}

// BenchmarkFleet measures each layout's memory, pick time and Apply
// throughput on a fleet (envFleet). Run one layout at a time at the full
// size: -bench 'Fleet/maps'.
func BenchmarkFleet(b *testing.B) {
	engines, blocks := fleetSize(b)
	entries := float64(engines) * float64(blocks)
	for _, l := range layouts {
		b.Run(l.name, func(b *testing.B) {
			var f *fleet
			b.Run("build", func(b *testing.B) {
				for b.Loop() {
					f = nil
					before := heap()
					start := time.Now()
					f = buildFleet(b, l.new, engines, blocks)
					took := time.Since(start)
					after := heap()
					b.ReportMetric(float64(after.HeapInuse-before.HeapInuse)/entries, "inuse-B/block")
					b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/entries, "alloc-B/block")
					b.ReportMetric(float64(after.HeapInuse-before.HeapInuse)/(1<<30), "inuse-GiB")
					b.ReportMetric(entries/took.Seconds(), "blocks/s")
				}
			})
			if f == nil {
				b.Skip("no fleet built")
			}
			pick := func(b *testing.B, keys []uint64, check func(i, n int) bool) {
				got := make([]int, len(f.engines))
				for b.Loop() {
					for i, e := range f.engines {
						got[i] = e.Match(keys)
					}
				}
				for i, n := range got {
					if !check(i, n) {
						b.Fatalf("engine %d matched %d blocks", i, n)
					}
				}
			}
			few := func(i, n int) bool { return (i%(engines/fewEngines) == 0) == (n == 32) && (n == 0 || n == 32) }
			b.Run("pick-few", func(b *testing.B) { pick(b, f.request, few) })
			b.Run("pick-all16", func(b *testing.B) { pick(b, f.shared, func(_, n int) bool { return n == 16 }) })
			b.Run("pick-few-parallel", func(b *testing.B) {
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						for _, e := range f.engines {
							e.Match(f.request)
						}
					}
				})
			})
			b.Run("pick-few-while-applying", func(b *testing.B) {
				// One goroutine stores and removes 16 blocks on one engine
				// after another, as the engines' events keep coming.
				tokens := make([]int32, eventBlocks*fleetBlockSize)
				fillerTokens(tokens, 0, 1<<20)
				hashes := make([]kvevents.Hash, eventBlocks)
				for i := range hashes {
					hashes[i] = kvevents.Hash(binaryName(1<<23 + i))
				}
				store := batch(kvevents.Event{Kind: kvevents.BlockStored, BlockHashes: hashes, TokenIDs: tokens,
					BlockSize: fleetBlockSize, Medium: "GPU"})
				remove := batch(removed("GPU", hashes...))
				stop := make(chan struct{})
				var wg sync.WaitGroup
				wg.Go(func() {
					for i := 0; ; i++ {
						select {
						case <-stop:
							return
						default:
						}
						e := f.engines[i%len(f.engines)]
						if e.Apply(store) != nil || e.Apply(remove) != nil {
							panic("apply")
						}
					}
				})
				pick(b, f.request, few)
				close(stop)
				wg.Wait()
			})
			f = nil
			b.Run("apply", func(b *testing.B) { benchApply(b, l.new(1<<20), blocks) })
		})
	}
}

// benchApply measures an engine's steady state at held blocks: every
// batch stores a prompt of eventBlocks blocks and removes the oldest.
func benchApply(b *testing.B, m matcher, held int) {
	chains := held / eventBlocks
	stores := make([]kvevents.Batch, 2*chains)
	removes := make([]kvevents.Batch, 2*chains)
	w := &chainWriter{m: m}
	for c := range stores {
		tokens := make([]int32, eventBlocks*fleetBlockSize)
		fillerTokens(tokens, 0, c)
		hashes := make([]kvevents.Hash, eventBlocks)
		for i := range hashes {
			hashes[i] = w.hash()
		}
		stores[c] = batch(kvevents.Event{Kind: kvevents.BlockStored, BlockHashes: hashes, TokenIDs: tokens,
			BlockSize: fleetBlockSize, Medium: "GPU"})
		removes[c] = batch(removed("GPU", hashes...))
	}
	for c := range chains {
		if err := m.Apply(stores[c]); err != nil {
			b.Fatal(err)
		}
	}
	i := 0
	for b.Loop() {
		if err := m.Apply(stores[(i+chains)%len(stores)]); err != nil {
			b.Fatal(err)
		}
		if err := m.Apply(removes[i%len(stores)]); err != nil {
			b.Fatal(err)
		}
		i++
	}
	b.ReportMetric(float64(i*eventBlocks)/b.Elapsed().Seconds(), "blocks/s")
}
