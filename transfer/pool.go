package transfer

import (
	"cmp"
	"errors"
	"fmt"
	"sync"

	"github.com/rs/zerolog"
)

// PoolConfig configures a Pool.
type PoolConfig struct {
	// Workers is the number of worker goroutines, each with its own queue;
	// default 2.
	Workers int
	// QueueSize bounds each worker's queue; default 64. A full queue makes
	// Submit fail with ErrQueueFull instead of blocking.
	QueueSize int
}

// WithDefaults returns the config with zero fields set to their defaults.
func (c PoolConfig) WithDefaults() PoolConfig {
	c.Workers = cmp.Or(c.Workers, 2)
	c.QueueSize = cmp.Or(c.QueueSize, 64)
	return c
}

func (c PoolConfig) validate() error {
	if c.Workers < 1 {
		return fmt.Errorf("pool config: workers must be at least 1, got %d", c.Workers)
	}
	if c.QueueSize < 1 {
		return fmt.Errorf("pool config: queue_size must be at least 1, got %d", c.QueueSize)
	}
	return nil
}

// Pool runs tasks on a fixed set of workers. Tasks with the same key go to
// the same worker and run in submission order (SGLang shards its transfer
// queues by bootstrap room the same way). It is safe for concurrent use.
type Pool struct {
	log    zerolog.Logger
	queues []chan func()
	wg     sync.WaitGroup

	mu     sync.RWMutex
	closed bool
}

// NewPool starts the workers.
func NewPool(cfg PoolConfig, log zerolog.Logger) (*Pool, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	p := &Pool{log: log, queues: make([]chan func(), cfg.Workers)}
	for i := range p.queues {
		q := make(chan func(), cfg.QueueSize)
		p.queues[i] = q
		p.wg.Go(func() { p.run(i, q) })
	}
	return p, nil
}

func (p *Pool) run(i int, q chan func()) {
	for task := range q {
		p.safe(i, task)
	}
}

func (p *Pool) safe(i int, task func()) {
	defer func() {
		if r := recover(); r != nil {
			p.log.Error().Int(LogWorker, i).Interface("panic", r).Msg("transfer task panicked")
		}
	}()
	task()
}

// Submit queues task on the worker for key without blocking: a full queue
// is ErrQueueFull, a closed pool ErrClosed.
func (p *Pool) Submit(key uint64, task func()) error {
	if task == nil {
		return errors.New("submit: nil task")
	}
	p.mu.RLock()
	defer p.mu.RUnlock()
	if p.closed {
		return fmt.Errorf("transfer pool: %w", ErrClosed)
	}
	q := p.queues[key%uint64(len(p.queues))]
	select {
	case q <- task:
		return nil
	default:
		return fmt.Errorf("worker %d has %d tasks queued: %w", key%uint64(len(p.queues)), cap(q), ErrQueueFull)
	}
}

// Close stops accepting tasks, lets the queued ones run, and waits for them.
func (p *Pool) Close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		p.wg.Wait()
		return
	}
	p.closed = true
	for _, q := range p.queues {
		close(q)
	}
	p.mu.Unlock()
	p.wg.Wait()
}
