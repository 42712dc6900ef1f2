package realengine

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/pdplane/pdplane/bench"
)

// engineStartLimit bounds one vLLM start: the first start of a fresh venv
// took ~55 s here, later ones 25-75 s, two at once on two cores.
const engineStartLimit = 4 * time.Minute

// servedModel is the name the engines serve the tiny model under.
const servedModel = "tiny"

// kvEventsTopic is the topic the prefill publishes its KV events under.
const kvEventsTopic = "kv@prefill"

// maxModelLen is the engines' --max-model-len: a prompt longer than it is
// vLLM's own 400.
const maxModelLen = 512

// vllmEngine is one vLLM engine process, restartable on the same ports.
type vllmEngine struct {
	role     string // "prefill" or "decode"
	port     int    // HTTP
	sidePort int    // NIXL side channel (VLLM_NIXL_SIDE_CHANNEL_PORT)
	// engineID, when set, is kv_transfer_config.engine_id: the id a decode
	// keys the prefill's NIXL handshake on (vLLM makes a uuid4 otherwise).
	engineID string
	// eventsPort and replayPort, when set, publish its KV events
	// (--kv-events-config: ZMQ PUB and the replay ROUTER).
	eventsPort, replayPort int
	p                      *bench.Process
	starts                 int
}

func (e *vllmEngine) URL() string { return "http://127.0.0.1:" + strconv.Itoa(e.port) }

// kvTransferConfig is vLLM's --kv-transfer-config for the engine's role:
// the split roles (kv_both is deprecated in 0.32), KV in host memory, and a
// lease long enough for a transfer on a loaded 2-core machine (one took
// 20 s here; under vLLM's default 30 s lease the prefill freed blocks a
// decode then read, "Potentially invalid KV blocks").
func (e *vllmEngine) kvTransferConfig() string {
	role := "kv_producer"
	if e.role == "decode" {
		role = "kv_consumer"
	}
	cfg := map[string]any{
		"kv_connector":              "NixlConnector",
		"kv_role":                   role,
		"kv_buffer_device":          "cpu",
		"kv_connector_extra_config": map[string]any{"kv_lease_duration": 120},
	}
	if e.engineID != "" {
		cfg["engine_id"] = e.engineID
	}
	b, _ := json.Marshal(cfg)
	return string(b)
}

// start starts the engine and waits until its /health answers 200.
func (e *vllmEngine) start(ctx context.Context, s *suite) error {
	e.starts++
	argv := []string{s.python, "-m", "vllm.entrypoints.openai.api_server",
		"--model", s.modelDir, "--served-model-name", servedModel,
		"--host", "127.0.0.1", "--port", strconv.Itoa(e.port),
		// float32, as the model is saved (scripts/make-tiny-model.py: bf16
		// takes vLLM's AMX kernel, which died with SIGILL here).
		"--max-model-len", strconv.Itoa(maxModelLen), "--dtype", "float32",
		// No torch.compile: the tiny model gains nothing from it, and it
		// adds ~30 s to every start.
		"--enforce-eager",
		// usage.prompt_tokens_details.cached_tokens, which testKVMoves
		// pins: it counts no KV loaded by transfer.
		"--enable-prompt-tokens-details",
		"--kv-transfer-config", e.kvTransferConfig()}
	if e.eventsPort != 0 {
		ev, _ := json.Marshal(map[string]any{"enable_kv_cache_events": true, "publisher": "zmq",
			"endpoint": fmt.Sprintf("tcp://*:%d", e.eventsPort), "replay_endpoint": fmt.Sprintf("tcp://*:%d", e.replayPort), "topic": kvEventsTopic})
		argv = append(argv, "--kv-events-config", string(ev))
	}
	env := []string{
		"VLLM_CPU_KVCACHE_SPACE=1", "VLLM_CPU_OMP_THREADS_BIND=nobind",
		"UCX_TLS=tcp,self", "UCX_NET_DEVICES=lo",
		"VLLM_HOST_IP=127.0.0.1",
		"VLLM_NIXL_SIDE_CHANNEL_HOST=127.0.0.1",
		"VLLM_NIXL_SIDE_CHANNEL_PORT=" + strconv.Itoa(e.sidePort),
		// The chat template renders in a worker; at high load its default
		// deadline answered 500.
		"VLLM_CHAT_TEMPLATE_RENDER_TIMEOUT=120",
		"HF_HUB_OFFLINE=1", "TRANSFORMERS_OFFLINE=1", "VLLM_NO_USAGE_STATS=1",
		"PYTHONUNBUFFERED=1",
	}
	name := fmt.Sprintf("vllm-%s#%d", e.role, e.starts)
	p, err := bench.Start(name, env, argv...)
	if err != nil {
		return err
	}
	e.p = p
	wctx, cancel := context.WithTimeout(ctx, engineStartLimit)
	defer cancel()
	if err := bench.WaitHTTP(wctx, e.URL()+"/health", p); err != nil {
		e.stop()
		return fmt.Errorf("%s did not come up: %w\n%s", name, err, tailOf(p.Output(), 3000))
	}
	unpinProcessGroup(p.PID())
	return nil
}

// stop ends the engine and every process it started (its process
// group): SIGTERM, so that vLLM frees its shared memory, then SIGKILL
// after a grace.
func (e *vllmEngine) stop() {
	if e.p == nil {
		return
	}
	e.p.StopGrace(10 * time.Second)
}

// kill ends the engine at once, as a crash would.
func (e *vllmEngine) kill() {
	if e.p != nil {
		e.p.Stop()
	}
}

// unpinProcessGroup lets every thread of the process group pgid run on
// every core. vLLM's CPU worker pins its model thread to the last core and
// every thread started after inherits the mask, so both engines of a pair
// would share one core (vllm/v1/worker/cpu_worker.py, with
// VLLM_CPU_OMP_THREADS_BIND=nobind too).
func unpinProcessGroup(pgid int) {
	var all unix.CPUSet
	for i := range runtime.NumCPU() {
		all.Set(i)
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, stat := range procs {
		b, err := os.ReadFile(stat)
		if err != nil {
			continue
		}
		// pid (comm) state ppid pgrp ...: comm may hold spaces.
		rest := string(b[strings.LastIndexByte(string(b), ')')+1:])
		f := strings.Fields(rest)
		if len(f) < 3 || f[2] != strconv.Itoa(pgid) {
			continue
		}
		tasks, _ := os.ReadDir(filepath.Join(filepath.Dir(stat), "task"))
		for _, t := range tasks {
			if tid, err := strconv.Atoi(t.Name()); err == nil {
				_ = unix.SchedSetaffinity(tid, &all)
			}
		}
	}
}

// buildModel makes the tiny model in dir with the venv's python
// (scripts/make-tiny-model.py; seconds, and nothing when it is there).
func buildModel(python, dir string) error {
	cmd := exec.Command(python, "../scripts/make-tiny-model.py", dir)
	cmd.Env = append(os.Environ(), "HF_HUB_OFFLINE=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("build the tiny model: %w\n%s", err, tailOf(string(out), 3000))
	}
	return nil
}

func tailOf(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "…" + s[len(s)-n:]
}
