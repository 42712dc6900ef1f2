package transfer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/rs/zerolog"
)

// WorkerConfig configures a Worker.
type WorkerConfig struct {
	// Source is the local (prefill) rank the worker sends from; its
	// memory must be registered with the backend.
	Source Source
	// Pool sizes the worker pool.
	Pool PoolConfig
	// Timeout bounds one job; default 60s.
	Timeout time.Duration
	// Resolve resolves destinations; default Resolve.
	Resolve ResolveFunc
}

// WithDefaults returns the config with zero fields set to their defaults.
func (c WorkerConfig) WithDefaults() WorkerConfig {
	c.Pool = c.Pool.WithDefaults()
	if c.Timeout <= 0 {
		c.Timeout = 60 * time.Second
	}
	return c
}

func (c WorkerConfig) validate() error {
	if len(c.Source.Geometry.KVDataPtrs) == 0 {
		return errors.New("worker config: source.geometry.kv_data_ptrs is empty")
	}
	if err := c.Source.Geometry.validate("source"); err != nil {
		return fmt.Errorf("worker config: %w", err)
	}
	if c.Source.AttnTPSize <= 0 {
		return errors.New("worker config: source.attn_tp_size must be positive")
	}
	return c.Pool.validate()
}

// Job is one request's KV to send to one destination rank.
type Job struct {
	Peer  Peer  // the destination rank
	Pages Pages // which pages go where
	// Notif is the notification of the transfer; on the mixed_segments path
	// each segment's carries "_part_<i>_<n>".
	Notif string
	// Room shards jobs onto workers: jobs of one room run in order.
	Room uint64
	// Done, if set, receives the result once.
	Done func(error)
}

// Worker sends KV pages to remote ranks: it loads each peer's metadata
// through a RemoteCache (reloading on a new generation), plans the request
// (raising *MissingMemKindError where SGLang raises "Missing NIXL
// destination KV memory kind"), and posts one WRITE per step on the
// prepared lists, on a pool with bounded queues.
type Worker struct {
	cfg   WorkerConfig
	b     Backend
	cache *RemoteCache
	pool  *Pool
	log   zerolog.Logger
	ctx   context.Context
	stop  context.CancelFunc
}

// NewWorker starts a worker over b.
func NewWorker(cfg WorkerConfig, b Backend, log zerolog.Logger) (*Worker, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	log = log.With().Str(LogComponent, "transfer.worker").Str(LogAgent, b.AgentName()).Logger()
	pool, err := NewPool(cfg.Pool, log)
	if err != nil {
		return nil, err
	}
	ctx, stop := context.WithCancel(context.Background())
	return &Worker{
		cfg:   cfg,
		b:     b,
		cache: NewRemoteCache(b, cfg.Source, cfg.Resolve, log),
		pool:  pool,
		log:   log,
		ctx:   ctx,
		stop:  stop,
	}, nil
}

// Cache returns the worker's remote-metadata cache.
func (w *Worker) Cache() *RemoteCache { return w.cache }

// Submit queues a job; it fails at once with ErrQueueFull when the job's
// worker is busy, rather than blocking.
func (w *Worker) Submit(j Job) error {
	return w.pool.Submit(j.Room, func() {
		ctx, cancel := context.WithTimeout(w.ctx, w.cfg.Timeout)
		defer cancel()
		err := w.Send(ctx, j)
		if err != nil {
			w.log.Warn().Err(err).Str(LogPeer, j.Peer.Key).Str(LogRemote, j.Peer.AgentName).Int64(LogGeneration, j.Peer.Generation).Uint64(LogRoom, j.Room).Msg("transfer failed")
		}
		if j.Done != nil {
			j.Done(err)
		}
	})
}

// Send runs a job on the calling goroutine.
func (w *Worker) Send(ctx context.Context, j Job) error {
	r, release, err := w.cache.Acquire(j.Peer)
	if err != nil {
		return err
	}
	defer release()
	plan, err := BuildPlan(w.cfg.Source, r.Dest, j.Pages, j.Notif)
	if err != nil {
		return fmt.Errorf("plan for %s: %w", j.Peer.AgentName, err)
	}
	reqs := make([]Request, 0, len(plan.Steps))
	var postErr error
	for _, st := range plan.Steps {
		if st.List >= len(r.Prepared) {
			postErr = fmt.Errorf("step for list %d of %d prepared: %w", st.List, len(r.Prepared), ErrInvalidDescs)
			break
		}
		req, err := r.Prepared[st.List].Post(ctx, OpWrite, st.LocalIdx, st.DstIdx, []byte(st.Notif))
		if err != nil {
			postErr = fmt.Errorf("%s path to %s: %w", plan.Path, j.Peer.AgentName, err)
			break
		}
		reqs = append(reqs, req)
	}
	var errs []error
	if postErr != nil {
		errs = append(errs, postErr)
	}
	for _, req := range reqs {
		if err := req.Wait(ctx); err != nil {
			errs = append(errs, fmt.Errorf("%s path to %s: %w", plan.Path, j.Peer.AgentName, err))
		}
	}
	return errors.Join(errs...)
}

// Close stops taking jobs, lets queued jobs finish (cancelling them after
// their timeout), and evicts every peer. The backend stays open.
func (w *Worker) Close() error {
	w.pool.Close()
	w.stop()
	return w.cache.Close()
}
