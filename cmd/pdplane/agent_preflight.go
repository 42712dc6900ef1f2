package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"

	"github.com/rs/zerolog"

	"github.com/pdplane/pdplane/agent"
	"github.com/pdplane/pdplane/cli"
	"github.com/pdplane/pdplane/transfer"
	"github.com/pdplane/pdplane/transfer/cuda"
	"github.com/pdplane/pdplane/transfer/nixl"
	"github.com/pdplane/pdplane/transfer/tcp"
)

// preflightFlags are the agent's --preflight* flags.
type preflightFlags struct {
	backend, ucxTLS, listen, advertise, fault, mem string
	maxSize                                        int
	cfg                                            agent.PreflightConfig
}

// probeSlots is how many initiators' slots of --preflight-max-size the
// probe region holds, so that prefills preflighting one decode at once
// rarely share bytes.
const probeSlots = 4

func (p *preflightFlags) register(fs *cli.FlagSet) {
	fs.Choice(&p.backend, "preflight", "off", []string{"off", "nixl", "tcp"}, "host a transfer worker with a probe region and, "+
		"on a prefill, preflight every candidate decode (WRITE a pattern with a notification, READ it back, compare) through "+
		"this backend; a failed preflight keeps the pair out of routing")
	fs.Int(&p.maxSize, "preflight-max-size", transfer.DefaultPreflightMaxSize, "largest rung of the preflight size ladder "+
		"(from 4 KiB, x4 a rung), in bytes")
	fs.Dur(&p.cfg.Interval, "preflight-interval", 0, "how old a passed preflight may grow before the pair is checked again (default 10m)")
	fs.Dur(&p.cfg.FailedInterval, "preflight-failed-interval", 0, "how soon a failed pair is checked again (default 30s)")
	fs.Dur(&p.cfg.Gap, "preflight-gap", 0, "least time between two preflights this agent starts: the per-host rate limit (default 1s)")
	fs.Dur(&p.cfg.Poll, "preflight-poll", 0, "how often a prefill's agent lists its pairs for due preflights (default 10s)")
	fs.Dur(&p.cfg.Ladder.Timeout, "preflight-timeout", 0, "deadline of one preflight (default 10s)")
	fs.Choice(&p.mem, "preflight-mem", "dram", []string{"dram", "vram"}, "memory kind of the probe regions, the one the engine's KV "+
		"uses: vram allocates them on GPU 0 through the CUDA runtime (libcudart.so, or $PDPLANE_CUDART_LIB); without one the agent "+
		"says why and probes DRAM")
	fs.Str(&p.ucxTLS, "preflight-ucx-tls", "", "--preflight nixl: UCX transports (UCX_TLS), e.g. tcp on a host without RDMA")
	fs.Str(&p.listen, "preflight-listen", "127.0.0.1:0", "--preflight tcp: address the transfer worker listens on")
	fs.Str(&p.advertise, "preflight-advertise", "", "--preflight tcp: address other agents dial (default: the listener's)")
	fs.Choice(&p.fault, "preflight-fault", "", []string{"deregister-probe"}, "fault injection for tests and drills: "+
		"deregister-probe publishes the probe region but deregisters it from the worker, so that preflights against this agent fail")
}

// preflightWorker is what --preflight starts: the backend, its registered
// regions and the agent's preflighter.
type preflightWorker struct {
	backend transfer.Backend
	host    *transfer.ProbeHost
	local   transfer.ProbeMemory // the initiator's region, registered
	frees   []func() error       // frees the regions' memory, after the backend is closed
	p       *agent.Preflighter
}

// vram allocates and registers both regions on GPU 0.
func (w *preflightWorker) vram(maxSize int) error {
	rt, err := cuda.Load()
	if err != nil {
		return err
	}
	if n, err := rt.DeviceCount(); err != nil || n == 0 {
		return fmt.Errorf("%s sees no CUDA device (%d, %v)", rt.Path(), n, err)
	}
	hostBuf, err := rt.Alloc(0, probeSlots*maxSize)
	if err != nil {
		return err
	}
	w.frees = append(w.frees, hostBuf.Free)
	loc, err := rt.Alloc(0, 2*maxSize)
	if err != nil {
		return err
	}
	w.frees = append(w.frees, loc.Free)
	return w.register(hostBuf, loc)
}

// register registers the initiator's region and makes the probe host.
func (w *preflightWorker) register(probe, local transfer.ProbeMemory) error {
	if err := w.backend.RegisterMemory(local.Region()); err != nil {
		return fmt.Errorf("register preflight region: %w", err)
	}
	w.local = local
	host, err := transfer.NewProbeHost(w.backend, probe)
	if err != nil {
		return err
	}
	w.host = host
	return nil
}

// start builds the transfer worker for a; nil when --preflight is off.
func (p *preflightFlags) start(a *agent.Agent, log zerolog.Logger) (*preflightWorker, error) {
	if p.backend == "off" || p.backend == "" {
		return nil, nil
	}
	p.cfg.Backend, p.cfg.Ladder.MaxSize = p.backend, p.maxSize
	p.cfg.Ladder = p.cfg.Ladder.WithDefaults()
	w := &preflightWorker{}
	var secret []byte
	name := "pdplane-probe-" + randomHex(6)
	switch p.backend {
	case "nixl":
		b, err := nixl.New(nixl.Config{AgentName: name, UCXTLS: p.ucxTLS}, log.With().Str("component", "transfer.nixl").Logger())
		if err != nil {
			return nil, fmt.Errorf("--preflight nixl: %w", err)
		}
		w.backend = b
	case "tcp":
		b, err := tcp.New(tcp.Config{AgentName: name, ListenAddr: p.listen, AdvertiseAddr: p.advertise,
			RemoteSecret: func(ctx context.Context, agent string) ([]byte, error) { return w.p.RemoteSecret(ctx, agent) }},
			log.With().Str("component", "transfer.tcp").Logger())
		if err != nil {
			return nil, fmt.Errorf("--preflight tcp: %w", err)
		}
		w.backend, secret = b, b.Secret()
	}
	if p.mem == "vram" {
		if err := w.vram(p.cfg.Ladder.MaxSize); err != nil {
			log.Warn().Err(err).Msg("no VRAM probe region; probing DRAM")
		}
	}
	if w.host == nil {
		if err := w.regions(p.cfg.Ladder.MaxSize); err != nil {
			w.close()
			return nil, err
		}
	}
	if p.fault == "deregister-probe" {
		if err := w.host.Deregister(); err != nil {
			w.close()
			return nil, err
		}
	}
	w.p = a.NewPreflighter(p.cfg, w.host, w.local, secret)
	return w, nil
}

// regions allocates and registers the probe region and the initiator's
// region in DRAM.
func (w *preflightWorker) regions(maxSize int) error {
	hostBuf, err := transfer.AllocHost(probeSlots * maxSize)
	if err != nil {
		return err
	}
	w.frees = append(w.frees, hostBuf.Free)
	loc, err := transfer.AllocHost(2 * maxSize)
	if err != nil {
		return err
	}
	w.frees = append(w.frees, loc.Free)
	return w.register(transfer.HostProbe{HostBuffer: hostBuf}, transfer.HostProbe{HostBuffer: loc})
}

// close releases the worker: registrations, backend, then memory.
func (w *preflightWorker) close() {
	if w.host != nil {
		_ = w.host.Close()
	}
	if w.local != nil && w.backend != nil {
		_ = w.backend.DeregisterMemory(w.local.Region())
	}
	if w.backend != nil {
		_ = w.backend.Close()
	}
	for _, free := range w.frees {
		_ = free()
	}
}

func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(errors.New("crypto/rand failed"))
	}
	return hex.EncodeToString(b)
}
