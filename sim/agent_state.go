package sim

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"

	"github.com/rs/zerolog"

	"github.com/pdplane/pdplane/transfer"
	"github.com/pdplane/pdplane/transfer/nixl"
	"github.com/pdplane/pdplane/transfer/tcp"
)

// agentState is one generation of the simulator's transfer agent: a backend
// under a fresh name with the KV pool registered, its metadata, and what
// uses it (the prefill's transfer worker, the decode's read-side cache).
// Reregister replaces it as a whole; requests keep the state they started
// with, so a request racing a re-registration fails cleanly rather than
// mixing generations.
type agentState struct {
	gen      int64
	name     string
	backend  transfer.Backend
	metadata []byte
	// secret is the TCP agent's transfer secret (nil for NIXL), registered
	// with the peer so that the control plane can hand it to other peers.
	secret   []byte
	geometry transfer.RankGeometry
	source   transfer.Source

	// worker sends KV pages to decodes (prefill).
	worker *transfer.Worker
	// reads holds the prefills this decode READs from (vLLM decode).
	reads *transfer.RemoteCache

	mu sync.Mutex
	// prefills holds, by bootstrap address, the prefill ranks this agent's
	// KV args went to (SGLang decode: once per prefill and agent, as
	// CommonKVReceiver's connection pool does).
	prefills map[string]rankEndpoint
	// connectMu lets one request at a time fetch a prefill's rank and send
	// it the KV args (Sim.prefillRank).
	connectMu sync.Mutex
}

// randomSuffix returns n random hex digits.
func randomSuffix(n int) string {
	b := make([]byte, (n+1)/2)
	if _, err := rand.Read(b); err != nil {
		panic(fmt.Sprintf("crypto/rand: %v", err)) // never fails on Linux
	}
	return hex.EncodeToString(b)[:n]
}

// newAgentState creates generation gen: a backend under a fresh agent name
// ("<name>-g<gen>-<random>"), the pool registered, the metadata taken after
// the registration.
func (s *Sim) newAgentState(gen int64) (*agentState, error) {
	name := fmt.Sprintf("%s-g%d-%s", s.cfg.Name, gen, randomSuffix(6))
	log := s.log.With().Str("agent", name).Logger()
	b, err := s.newBackend(name, log)
	if err != nil {
		return nil, fmt.Errorf("transfer backend %s: %w", s.cfg.Transfer, err)
	}
	st := &agentState{gen: gen, name: name, backend: b, prefills: map[string]rankEndpoint{}}
	if tb, ok := b.(*tcp.Backend); ok {
		st.secret = tb.Secret()
	}
	fail := func(err error) (*agentState, error) {
		st.close(log)
		return nil, err
	}
	if err := b.RegisterMemory(s.pool.buf.Region()); err != nil {
		return fail(fmt.Errorf("register KV pool: %w", err))
	}
	if st.metadata, err = b.LocalMetadata(); err != nil {
		return fail(fmt.Errorf("agent metadata: %w", err))
	}
	st.geometry = s.pool.geometry(name)
	st.source = transfer.Source{
		Geometry: st.geometry, AttnTPSize: 1, AttnTPRank: 0,
		PageSize: s.cfg.PageSize, TotalKVHeads: s.cfg.NumKVHeads,
	}
	if s.cfg.Role.Prefills() {
		st.worker, err = transfer.NewWorker(transfer.WorkerConfig{
			Source: st.source,
			// Every queued job holds pages of the pool, so the pool
			// bounds the queue: one slot per page never refuses a job
			// the engine has the memory for ("KV transfer queue full"
			// at a few hundred concurrent requests otherwise).
			Pool:    transfer.PoolConfig{QueueSize: max(64, s.cfg.Pages)},
			Timeout: s.cfg.TransferTimeout,
			Resolve: resolveDecode,
		}, b, log)
		if err != nil {
			return fail(fmt.Errorf("transfer worker: %w", err))
		}
	} else {
		st.reads = transfer.NewRemoteCache(b, st.source, s.resolveRead, log)
	}
	return st, nil
}

func (s *Sim) newBackend(name string, log zerolog.Logger) (transfer.Backend, error) {
	if s.cfg.Transfer == TransferNIXL {
		return nixl.New(nixl.Config{AgentName: name, UCXTLS: s.cfg.UCXTLS}, log)
	}
	// A fresh secret for every generation when the control plane hands
	// them out; the shared one otherwise (nil draws a random one).
	var secret []byte
	if s.cfg.TransferSecrets == nil {
		secret = s.cfg.SharedTransferSecret
	}
	return tcp.New(tcp.Config{AgentName: name, ListenAddr: s.cfg.TransferAddr, IOTimeout: s.cfg.TransferTimeout,
		Secret: secret, RemoteSecret: s.remoteSecret}, log)
}

// remoteSecret resolves the transfer secret of a remote TCP agent: from the
// control plane for the peer that announced the agent (a decode's KV args,
// a prefill's side channel), or the shared secret.
func (s *Sim) remoteSecret(ctx context.Context, agent string) ([]byte, error) {
	if s.cfg.TransferSecrets == nil {
		if s.cfg.SharedTransferSecret == nil {
			return nil, fmt.Errorf("no control plane and no shared transfer secret: agent %s cannot be authenticated", agent)
		}
		return s.cfg.SharedTransferSecret, nil
	}
	// A vLLM prefill's side channel names its peer; SGLang's bootstrap
	// plane does not, and the control plane finds the agent's peer.
	var peerID string
	if a, ok := s.sides.get(agent); ok {
		peerID = a.PeerID
	}
	return s.cfg.TransferSecrets(ctx, peerID, agent)
}

// close stops the worker (waiting for its transfers), drops the loaded
// remotes and closes the backend, which deregisters the pool.
func (st *agentState) close(log zerolog.Logger) {
	var errs []error
	if st.worker != nil {
		errs = append(errs, st.worker.Close())
	}
	if st.reads != nil {
		errs = append(errs, st.reads.Close())
	}
	errs = append(errs, st.backend.Close())
	if err := errors.Join(errs...); err != nil {
		log.Warn().Err(err).Str("agent", st.name).Msg("close transfer agent")
	}
}

// prefill returns the rank of the prefill at addr this agent registered
// with.
func (st *agentState) prefill(addr string) (rankEndpoint, bool) {
	st.mu.Lock()
	defer st.mu.Unlock()
	ep, ok := st.prefills[addr]
	return ep, ok
}

func (st *agentState) setPrefill(addr string, ep rankEndpoint) {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.prefills[addr] = ep
}

func (st *agentState) forgetPrefill(addr string) {
	st.mu.Lock()
	defer st.mu.Unlock()
	delete(st.prefills, addr)
}

// evictReads drops every loaded prefill so that the next read prepares it
// again.
func (st *agentState) evictReads() error {
	if st.reads == nil {
		return nil
	}
	return st.reads.EvictAll()
}

// resolveDecode is the prefill's preparation of a decode's destination
// (SGLang's _prepare_payload_xfer). A decode whose KV args came without
// memory kinds is accepted as SGLang accepts it, and left with neither a
// homogeneous kind nor segments: the state in which the transfer path
// raises *transfer.MissingMemKindError.
func resolveDecode(src transfer.Source, dst transfer.RankGeometry, dstAttnTPSize, dstAttnTPRank int) (*transfer.Destination, error) {
	if len(dst.KVMemKinds) == 0 {
		return &transfer.Destination{Geometry: dst, AttnTPSize: dstAttnTPSize, AttnTPRank: dstAttnTPRank}, nil
	}
	return transfer.Resolve(src, dst, dstAttnTPSize, dstAttnTPRank)
}

// resolveRead is a vLLM decode's preparation of a prefill it reads from.
// Under the missing-mem-kind fault it leaves the destination unresolved,
// so that the read raises *transfer.MissingMemKindError.
func (s *Sim) resolveRead(src transfer.Source, dst transfer.RankGeometry, dstAttnTPSize, dstAttnTPRank int) (*transfer.Destination, error) {
	if s.Fault() == FaultMissingMemKind {
		return &transfer.Destination{Geometry: dst, AttnTPSize: dstAttnTPSize, AttnTPRank: dstAttnTPRank}, nil
	}
	return transfer.Resolve(src, dst, dstAttnTPSize, dstAttnTPRank)
}
