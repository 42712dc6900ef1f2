package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
)

// HostPort is the host:port of an http:// URL.
func HostPort(raw string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", err
	}
	if u.Scheme != "http" || u.Port() == "" {
		return "", errors.New("want http://host:port")
	}
	return u.Host, nil
}

// ParseInts parses a comma-separated list of positive integers.
func ParseInts(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil || n < 1 {
			return nil, fmt.Errorf("want positive integers separated by commas, got %q", f)
		}
		out = append(out, n)
	}
	if len(out) == 0 {
		return nil, errors.New("want at least one number")
	}
	return out, nil
}

// FindRouter is the router executable: bin when set, else .venv/bin/NAME
// under the working directory, else NAME on $PATH; "" when none exists.
func FindRouter(bin, name string) string {
	if bin != "" {
		if _, err := os.Stat(bin); err != nil {
			return ""
		}
		return bin
	}
	if p, err := filepath.Abs(filepath.Join(".venv", "bin", name)); err == nil {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	p, _ := exec.LookPath(name)
	return p
}

// InstallRouters runs scripts/install-routers.sh from the working
// directory (the repository root) and returns the paths it prints.
func InstallRouters(ctx context.Context) (smg, vllmRouter string, err error) {
	cmd := exec.CommandContext(ctx, filepath.Join("scripts", "install-routers.sh"))
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return "", "", fmt.Errorf("install routers (run from the repository root): %w", err)
	}
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "PDPLANE_SMG="); ok {
			smg = v
		}
		if v, ok := strings.CutPrefix(sc.Text(), "PDPLANE_VLLM_ROUTER="); ok {
			vllmRouter = v
		}
	}
	return smg, vllmRouter, nil
}
