package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/pdplane/pdplane/pdproto"
	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/server/api"
	"github.com/pdplane/pdplane/server/api/apiconv"
)

// SpecFileEngine is a real engine (SGLang, vLLM) described by a registration
// file that its launcher writes: the KV geometry, NIXL agent names and
// metadata per rank, which engines do not serve over HTTP. When EngineURL is
// set, fields the file leaves empty are filled from SGLang's /server_info
// (model, role, bootstrap port, parallelism, page size, KV dtype).
// Re-registration runs ReregisterCmd, which must
// make the engine create fresh NIXL agents and rewrite the file. The
// agent's probes, not the file, say whether the engine is healthy and how
// busy it is.
type SpecFileEngine struct {
	Path          string
	EngineURL     string
	ReregisterCmd string
	Client        *http.Client // http.DefaultClient with a 5 s timeout when nil
}

var _ Engine = (*SpecFileEngine)(nil)

// Spec reads the file and completes it from /server_info.
func (e *SpecFileEngine) Spec(ctx context.Context) (registry.PeerSpec, error) {
	data, err := os.ReadFile(e.Path)
	if err != nil {
		return registry.PeerSpec{}, fmt.Errorf("read peer spec: %w", err)
	}
	// The file is a registration body.
	var body api.PeerRegistration
	if err := json.Unmarshal(data, &body); err != nil {
		return registry.PeerSpec{}, fmt.Errorf("parse peer spec %s: %w", e.Path, err)
	}
	s, err := apiconv.Spec(&body)
	if err != nil {
		return registry.PeerSpec{}, fmt.Errorf("parse peer spec %s: %w", e.Path, err)
	}
	if e.EngineURL == "" {
		return s, nil
	}
	info, err := e.serverInfo(ctx)
	if err != nil {
		return registry.PeerSpec{}, err
	}
	// What the file leaves empty and /server_info tells is observed; the
	// rest of the file is declared.
	observed := func(field string) {
		if s.Provenance(field) == registry.Declared {
			s.Observed = append(s.Observed, field)
		}
	}
	fill := func(field string, dst *int, v int) {
		if *dst == 0 && v != 0 {
			*dst = v
			observed(field)
		}
	}
	if s.URL == "" {
		s.URL = strings.TrimRight(e.EngineURL, "/")
	}
	if s.Engine == "" {
		s.Engine = registry.EngineSGLang
	}
	if s.Model == "" {
		s.Model = info.ServedModelName
		if s.Model == "" {
			s.Model = info.ModelPath
		}
		if s.Model != "" {
			observed("model")
		}
	}
	if s.Role == "" {
		switch apiconv.Deref(info.DisaggregationMode) {
		case "prefill":
			s.Role = registry.RolePrefill
		case "decode":
			s.Role = registry.RoleDecode
		}
		if s.Role != "" {
			observed("role")
		}
	}
	if s.Role.Prefills() {
		fill("bootstrap_port", &s.BootstrapPort, info.DisaggregationBootstrapPort)
	}
	fill("parallelism.tp_size", &s.Parallelism.TPSize, apiconv.Deref(info.TPSize))
	fill("parallelism.dp_size", &s.Parallelism.DPSize, info.DPSize)
	fill("parallelism.pp_size", &s.Parallelism.PPSize, info.PPSize)
	fill("kv.page_size", &s.KV.PageSize, apiconv.Deref(info.PageSize))
	if s.KV.DType == "" && info.KVCacheDType != "" && info.KVCacheDType != "auto" {
		s.KV.DType = info.KVCacheDType
		observed("kv.dtype")
	}
	return s.WithDefaults(), nil
}

func (e *SpecFileEngine) serverInfo(ctx context.Context) (*pdproto.SGLangServerInfo, error) {
	c := e.Client
	if c == nil {
		c = &http.Client{Timeout: 5 * time.Second}
	}
	var lastErr error
	for _, path := range []string{"/server_info", "/get_server_info"} { // newer SGLang, then older
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(e.EngineURL, "/")+path, nil)
		if err != nil {
			return nil, err
		}
		resp, err := c.Do(req)
		if err != nil {
			lastErr = err
			continue
		}
		var info pdproto.SGLangServerInfo
		err = json.NewDecoder(resp.Body).Decode(&info)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			lastErr = fmt.Errorf("%s answered %d", path, resp.StatusCode)
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("parse %s: %w", path, err)
		}
		return &info, nil
	}
	return nil, fmt.Errorf("read engine server info from %s: %w", e.EngineURL, lastErr)
}

// Reregister runs the operator's command.
func (e *SpecFileEngine) Reregister(ctx context.Context, reason string) error {
	if e.ReregisterCmd == "" {
		return errors.New("the control plane asks for re-registration with fresh NIXL agents, but no re-register command is set")
	}
	cmd := exec.CommandContext(ctx, "/bin/sh", "-c", e.ReregisterCmd)
	cmd.Env = append(os.Environ(), "PDPLANE_REREGISTER_REASON="+reason, "PDPLANE_SPEC_FILE="+e.Path)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("run re-register command: %w", err)
	}
	return nil
}
