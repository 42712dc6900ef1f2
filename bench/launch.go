package bench

import (
	"context"
	"fmt"
	"strconv"
	"time"
)

// SimSpec is one `pdplane sim` engine to start.
type SimSpec struct {
	Engine string // "sglang" or "vllm"
	Role   string // "prefill" or "decode"
	// Name is the engine's name, unique among the engines registered
	// with one control plane (a second of the same name takes the first's
	// place); default "<engine>-<role>".
	Name string
	// ControlPlane is the `pdplane serve` to register with; empty runs the
	// engine alone (give it TransferSecret then, shared by its peers).
	ControlPlane   string
	TransferSecret string
	// KVPages sizes the KV pool (0: the simulator's default).
	KVPages int
	// CheapTransfer computes and verifies no KV and moves one page per
	// request (see `pdplane sim --cheap-transfer`).
	CheapTransfer bool
	// NumLayers, NumKVHeads and HeadDim set the KV geometry, so how many
	// bytes a page moves (0: the simulator's defaults).
	NumLayers, NumKVHeads, HeadDim int
	// DecodeTimePerToken slows generation (held streams).
	DecodeTimePerToken time.Duration
	// PrefillTimePerToken is the compute time of each prompt token the
	// prefill's prefix cache does not hold; PrefillSlots, how many
	// prompts it computes at once (0: no limit). See `pdplane sim
	// --prefill-time-per-token` and `--prefill-slots`.
	PrefillTimePerToken time.Duration
	PrefillSlots        int
	// PrefixCachePages holds a prefill's prefix cache below its pool
	// (`pdplane sim --prefix-cache-pages`); 0: the whole pool.
	PrefixCachePages int
	// PageSize is the tokens of a KV page, the prefix cache's block (0:
	// the simulator's default).
	PageSize int
	// KVEventsAddr and KVEventsReplayAddr, when set, are where a prefill
	// publishes its KV events and replays them (host:port, as `pdplane sim
	// --kv-events-addr` and `--kv-events-replay-addr` take them), under
	// KVEventsTopic.
	KVEventsAddr, KVEventsReplayAddr, KVEventsTopic string
	LogLevel                                        string // default "warn"
}

// Sim is a running `pdplane sim`.
type Sim struct {
	*Process
	URL string
	// BootstrapPort is an SGLang prefill's bootstrap port, 0 otherwise.
	BootstrapPort int
}

// StartSim starts the engine of spec with the pdplane binary bin and waits
// until its /health answers 200.
func StartSim(ctx context.Context, bin string, spec SimSpec) (*Sim, error) {
	port, err := FreePort()
	if err != nil {
		return nil, err
	}
	s := &Sim{URL: "http://127.0.0.1:" + strconv.Itoa(port)}
	name := spec.Name
	if name == "" {
		name = spec.Engine + "-" + spec.Role
	}
	level := spec.LogLevel
	if level == "" {
		level = "warn"
	}
	args := []string{bin, "sim", "--engine", spec.Engine, "--role", spec.Role, "--name", name,
		"--sim-addr", "127.0.0.1:" + strconv.Itoa(port), "--log-level", level}
	if spec.Engine == "sglang" && spec.Role == "prefill" {
		if s.BootstrapPort, err = FreePort(); err != nil {
			return nil, err
		}
		args = append(args, "--bootstrap-port", strconv.Itoa(s.BootstrapPort))
	}
	if spec.ControlPlane != "" {
		args = append(args, "--control-plane", spec.ControlPlane)
	}
	if spec.KVPages > 0 {
		args = append(args, "--kv-pages", strconv.Itoa(spec.KVPages))
	}
	if spec.CheapTransfer {
		args = append(args, "--cheap-transfer")
	}
	for _, g := range []struct {
		flag string
		v    int
	}{{"--num-layers", spec.NumLayers}, {"--num-kv-heads", spec.NumKVHeads}, {"--head-dim", spec.HeadDim}} {
		if g.v > 0 {
			args = append(args, g.flag, strconv.Itoa(g.v))
		}
	}
	if spec.DecodeTimePerToken > 0 {
		args = append(args, "--decode-time-per-token", spec.DecodeTimePerToken.String())
	}
	if spec.PrefillTimePerToken > 0 {
		args = append(args, "--prefill-time-per-token", spec.PrefillTimePerToken.String())
	}
	if spec.PageSize > 0 {
		args = append(args, "--page-size", strconv.Itoa(spec.PageSize))
	}
	if spec.PrefillSlots > 0 {
		args = append(args, "--prefill-slots", strconv.Itoa(spec.PrefillSlots))
	}
	if spec.PrefixCachePages > 0 {
		args = append(args, "--prefix-cache-pages", strconv.Itoa(spec.PrefixCachePages))
	}
	for _, f := range []struct{ flag, v string }{
		{"--kv-events-addr", spec.KVEventsAddr}, {"--kv-events-replay-addr", spec.KVEventsReplayAddr}, {"--kv-events-topic", spec.KVEventsTopic},
	} {
		if f.v != "" {
			args = append(args, f.flag, f.v)
		}
	}
	// $PDPLANE_PPROF_ADDR and $PDPLANE_GC_MIN_HEAP_MIB in the harness's
	// environment are for the router's serve: an engine that took them
	// would fail on the profile port serve holds, or run differently.
	env := []string{"PDPLANE_PPROF_ADDR=", "PDPLANE_GC_MIN_HEAP_MIB="}
	if spec.TransferSecret != "" {
		env = append(env, "PDPLANE_TRANSFER_SECRET="+spec.TransferSecret)
	}
	if s.Process, err = Start(name+" sim", env, args...); err != nil {
		return nil, err
	}
	if err := waitStarted(ctx, s.Process, s.URL+"/health"); err != nil {
		return nil, err
	}
	return s, nil
}

// startTimeout bounds how long a process may take to answer its first
// health check.
const startTimeout = 90 * time.Second

// waitStarted waits for url to answer 200, stopping p when it does not.
func waitStarted(ctx context.Context, p *Process, url string) error {
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	if err := WaitHTTP(ctx, url, p); err != nil {
		p.Stop()
		return fmt.Errorf("%s: %w\n%s", p.Name, err, tail(p.Output(), 4000))
	}
	return nil
}

// loopback returns the flags that keep a Rust router's listeners on
// loopback: its own port and its Prometheus listener (by default
// 0.0.0.0:29000) on a free one.
func loopback(port int) ([]string, error) {
	prom, err := FreePort()
	if err != nil {
		return nil, err
	}
	return []string{"--host", "127.0.0.1", "--port", strconv.Itoa(port),
		"--prometheus-host", "127.0.0.1", "--prometheus-port", strconv.Itoa(prom)}, nil
}

// SMGArgs is the command line of SMG (`smg launch`) on 127.0.0.1:port with
// the given log level ("" keeps SMG's default); append its worker flags.
func SMGArgs(bin string, port int, logLevel string) ([]string, error) {
	l, err := loopback(port)
	if err != nil {
		return nil, err
	}
	args := append([]string{bin, "launch"}, l...)
	if logLevel != "" {
		args = append(args, "--log-level", logLevel)
	}
	return args, nil
}

// SMGPDArgs is SMGArgs in PD mode in front of an SGLang prefill and decode,
// as `smg launch --pd-disaggregation --prefill URL BOOTSTRAP_PORT --decode
// URL` runs in front of real ones.
func SMGPDArgs(bin string, port int, logLevel string, prefill, decode *Sim) ([]string, error) {
	return SMGPDFleetArgs(bin, port, logLevel, []*Sim{prefill}, []*Sim{decode})
}

// SMGPDFleetArgs is SMGPDArgs in front of several SGLang prefills and
// decodes: --prefill URL BOOTSTRAP_PORT once per prefill, --decode URL
// once per decode.
func SMGPDFleetArgs(bin string, port int, logLevel string, prefills, decodes []*Sim) ([]string, error) {
	args, err := SMGArgs(bin, port, logLevel)
	if err != nil {
		return nil, err
	}
	args = append(args, "--pd-disaggregation")
	for _, p := range prefills {
		args = append(args, "--prefill", p.URL, strconv.Itoa(p.BootstrapPort))
	}
	for _, d := range decodes {
		args = append(args, "--decode", d.URL)
	}
	return args, nil
}

// VLLMRouterPDArgs is the command line of vllm-router on 127.0.0.1:port in
// PD mode (`--vllm-pd-disaggregation --prefill URL --decode URL`) with the
// given log level ("" keeps its default).
func VLLMRouterPDArgs(bin string, port int, logLevel string, prefill, decode *Sim) ([]string, error) {
	return VLLMRouterPDFleetArgs(bin, port, logLevel, []*Sim{prefill}, []*Sim{decode})
}

// VLLMRouterPDFleetArgs is VLLMRouterPDArgs in front of several vLLM
// prefills and decodes, each given with its own --prefill or --decode.
func VLLMRouterPDFleetArgs(bin string, port int, logLevel string, prefills, decodes []*Sim) ([]string, error) {
	l, err := loopback(port)
	if err != nil {
		return nil, err
	}
	args := append([]string{bin}, l...)
	if logLevel != "" {
		args = append(args, "--log-level", logLevel)
	}
	args = append(args, "--vllm-pd-disaggregation")
	for _, p := range prefills {
		args = append(args, "--prefill", p.URL)
	}
	for _, d := range decodes {
		args = append(args, "--decode", d.URL)
	}
	return args, nil
}

// FloorArgs is the command line of Floor (`pdplane bench floor`, with the
// pdplane binary bin) on 127.0.0.1:port in front of an SGLang prefill and
// decode, on net/http's server when netHTTP is set.
func FloorArgs(bin string, port int, prefill, decode *Sim, netHTTP bool) []string {
	args := []string{bin, "bench", "floor", "--addr", "127.0.0.1:" + strconv.Itoa(port),
		"--prefill", prefill.URL, "--bootstrap-port", strconv.Itoa(prefill.BootstrapPort), "--decode", decode.URL}
	if netHTTP {
		args = append(args, "--net-http")
	}
	return args
}
