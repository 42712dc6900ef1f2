package agent

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// HealRequest is what the control plane asks the agent to heal.
type HealRequest struct {
	PeerID, Name string
	Generation   int64
	Reason       string
}

// HealAction restarts the engine so that it comes back with fresh NIXL
// agents (a stock SGLang engine creates its agent once, inside its process:
// only a restart gives it a new one). Run carries the action out once and
// returns when it was carried out, not when the engine is back: the control
// plane verifies that (a new instance, generation + 1). An error carries the
// tail of the action's output.
type HealAction interface {
	Kind() string
	Run(ctx context.Context, r HealRequest) error
}

// ErrHealManual is what the `none` heal action returns: the agent cannot
// restart the engine, and the caller should record that an operator must
// (alert only).
var ErrHealManual = errors.New("no heal action is configured (--heal none): an operator must restart the engine")

// healKinds names the accepted heal specs, for error messages.
const healKinds = "exec:CMD, systemd:UNIT, kubernetes, none"

// healOutputTail is how much of an action's output an error carries.
const healOutputTail = 2048

// execWaitDelay is how long an exec or systemd action's Run waits, once its
// process has exited, for descendants that keep its output open (an engine
// started in the background without redirecting its output) before it
// closes the output and returns.
const execWaitDelay = 2 * time.Second

// HealOption adjusts ParseHealAction.
type HealOption func(*healOptions)

type healOptions struct {
	systemctl string
	saDir     string
	apiBase   string
	env       func(HealRequest) []string
}

// WithSystemctl sets the systemctl binary the systemd action runs (default
// "systemctl", looked up in PATH).
func WithSystemctl(path string) HealOption { return func(o *healOptions) { o.systemctl = path } }

// WithServiceAccountDir sets the directory the kubernetes action reads the
// service-account token, CA and namespace from (default
// /var/run/secrets/kubernetes.io/serviceaccount).
func WithServiceAccountDir(dir string) HealOption { return func(o *healOptions) { o.saDir = dir } }

// WithKubernetesAPI sets the API server's base URL (default
// https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT).
func WithKubernetesAPI(base string) HealOption { return func(o *healOptions) { o.apiBase = base } }

// WithExecEnv adds, to the environment of an exec action's command, the
// variables env returns for each request ("KEY=value"), after the
// PDPLANE_* variables every exec action gets.
func WithExecEnv(env func(HealRequest) []string) HealOption {
	return func(o *healOptions) { o.env = env }
}

// DefaultServiceAccountDir is where Kubernetes mounts a pod's
// service-account token, CA and namespace.
const DefaultServiceAccountDir = "/var/run/secrets/kubernetes.io/serviceaccount"

// ParseHealAction parses a heal spec: `exec:CMD`, `systemd:UNIT`,
// `kubernetes` or `none`. It checks what it can at once (a unit name, that
// the kubernetes action runs in a pod), so that an agent with a bad spec
// refuses to start instead of failing its first heal.
func ParseHealAction(spec string, opts ...HealOption) (HealAction, error) {
	o := healOptions{systemctl: "systemctl", saDir: DefaultServiceAccountDir}
	for _, opt := range opts {
		opt(&o)
	}
	kind, arg, hasArg := strings.Cut(spec, ":")
	switch kind {
	case "exec":
		if strings.TrimSpace(arg) == "" {
			return nil, errors.New("heal action exec needs a command: exec:CMD")
		}
		return &execHeal{cmd: arg, env: o.env}, nil
	case "systemd":
		unit, err := systemdUnit(arg)
		if err != nil {
			return nil, fmt.Errorf("heal action systemd:%s: %w", arg, err)
		}
		return &systemdHeal{unit: unit, systemctl: o.systemctl}, nil
	case "kubernetes":
		if hasArg {
			return nil, fmt.Errorf("heal action kubernetes takes no argument (got %q): it deletes the agent's own pod", spec)
		}
		k := &kubernetesHeal{saDir: o.saDir, apiBase: o.apiBase}
		if k.apiBase == "" {
			host, port := os.Getenv("KUBERNETES_SERVICE_HOST"), os.Getenv("KUBERNETES_SERVICE_PORT")
			if host == "" || port == "" {
				return nil, errors.New("heal action kubernetes: not running in a Kubernetes pod " +
					"(KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not set)")
			}
			k.apiBase = "https://" + net.JoinHostPort(host, port)
		}
		if _, err := url.Parse(k.apiBase); err != nil {
			return nil, fmt.Errorf("heal action kubernetes: API base: %w", err)
		}
		if _, err := k.load(); err != nil {
			return nil, fmt.Errorf("heal action kubernetes: %w", err)
		}
		return k, nil
	case "none":
		if hasArg {
			return nil, fmt.Errorf("heal action none takes no argument (got %q)", spec)
		}
		return noneHeal{}, nil
	}
	return nil, fmt.Errorf("unknown heal action %q: want one of %s", spec, healKinds)
}

// execHeal runs a shell command.
type execHeal struct {
	cmd string
	env func(HealRequest) []string
}

func (e *execHeal) Kind() string { return "exec" }

// Run runs `/bin/sh -c CMD` with PDPLANE_PEER_ID, PDPLANE_PEER_NAME,
// PDPLANE_GENERATION and PDPLANE_HEAL_REASON added to the agent's
// environment, in a process group of its own that is killed when ctx ends.
func (e *execHeal) Run(ctx context.Context, r HealRequest) error {
	env := append(os.Environ(),
		"PDPLANE_PEER_ID="+r.PeerID,
		"PDPLANE_PEER_NAME="+r.Name,
		"PDPLANE_GENERATION="+strconv.FormatInt(r.Generation, 10),
		"PDPLANE_HEAL_REASON="+r.Reason)
	if e.env != nil {
		env = append(env, e.env(r)...)
	}
	return runHealCommand(ctx, "heal command", env, "/bin/sh", "-c", e.cmd)
}

// systemdHeal restarts a systemd unit.
type systemdHeal struct{ unit, systemctl string }

func (s *systemdHeal) Kind() string { return "systemd" }

// Run runs `systemctl restart UNIT`, which returns once systemd has
// restarted the unit (for Type=notify units: once the engine says ready).
func (s *systemdHeal) Run(ctx context.Context, _ HealRequest) error {
	return runHealCommand(ctx, "systemctl restart "+s.unit, os.Environ(), s.systemctl, "restart", "--", s.unit)
}

// unitSuffixes are systemd's unit types.
var unitSuffixes = []string{".service", ".socket", ".device", ".mount", ".automount", ".swap",
	".target", ".path", ".timer", ".slice", ".scope"}

// systemdUnit checks a unit name (systemd's unit_name_is_valid: ASCII
// letters, digits and ":-_.\@", at most 255 characters) and gives a name
// without a unit suffix `.service`.
func systemdUnit(name string) (string, error) {
	if name == "" {
		return "", errors.New("a unit name is required: systemd:UNIT")
	}
	if strings.HasPrefix(name, "-") {
		return "", errors.New("a unit name cannot start with '-'")
	}
	for _, c := range name {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.ContainsRune(":-_.\\@", c)) {
			return "", fmt.Errorf("%q is not allowed in a systemd unit name (letters, digits and \":-_.\\@\")", c)
		}
	}
	suffixed := false
	for _, s := range unitSuffixes {
		if strings.HasSuffix(name, s) && len(name) > len(s) {
			suffixed = true
			break
		}
	}
	if !suffixed {
		name += ".service"
	}
	if len(name) > 255 {
		return "", errors.New("a systemd unit name has at most 255 characters")
	}
	if strings.HasPrefix(name, ".") || strings.HasPrefix(name, "@") {
		return "", errors.New("a systemd unit name needs a name before its suffix")
	}
	return name, nil
}

// runHealCommand runs a command in a process group of its own, with its
// combined output kept (the tail) for an error. When ctx ends, the whole
// group is killed.
func runHealCommand(ctx context.Context, what string, env []string, name string, args ...string) error {
	var out tailBuffer
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error {
		// The group's id is the leader's pid (Setpgid). Children that
		// started sessions of their own are out of reach.
		return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
	cmd.WaitDelay = execWaitDelay
	err := cmd.Run()
	if errors.Is(err, exec.ErrWaitDelay) && ctx.Err() == nil {
		// It exited 0, but a descendant still holds its output: what it
		// had to carry out is carried out.
		return nil
	}
	if err == nil {
		return nil
	}
	if ctx.Err() != nil {
		err = fmt.Errorf("%w (process group killed)", context.Cause(ctx))
	}
	return fmt.Errorf("%s: %w%s", what, err, out.tailText())
}

// tailBuffer keeps the last healOutputTail bytes written to it. It needs no
// lock: exec.Cmd, given the same comparable writer as Stdout and Stderr,
// calls Write from one goroutine at a time.
type tailBuffer struct{ b []byte }

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.b = append(t.b, p...)
	if over := len(t.b) - healOutputTail; over > 0 {
		t.b = append(t.b[:0], t.b[over:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) tailText() string {
	s := strings.TrimSpace(strings.ToValidUTF8(string(t.b), ""))
	if s == "" {
		return " (no output)"
	}
	return "; output:\n" + s
}

// tail gives the last healOutputTail bytes of b.
func tail(b []byte) string {
	if len(b) > healOutputTail {
		b = b[len(b)-healOutputTail:]
	}
	return strings.TrimSpace(string(b))
}

// kubernetesHeal deletes the agent's own pod through the in-cluster API;
// the pod's controller (Deployment, StatefulSet, LeaderWorkerSet) starts a
// new one, whose engine has fresh NIXL agents. The agent must run in the
// engine's pod (a sidecar).
type kubernetesHeal struct {
	saDir, apiBase string
}

func (k *kubernetesHeal) Kind() string { return "kubernetes" }

// kubeConfig is what one deletion reads, again on every run: projected
// service-account tokens rotate.
type kubeConfig struct {
	token, namespace, pod string
	roots                 *x509.CertPool
}

func (k *kubernetesHeal) load() (kubeConfig, error) {
	var c kubeConfig
	read := func(name string) (string, error) {
		b, err := os.ReadFile(filepath.Join(k.saDir, name))
		if err != nil {
			return "", fmt.Errorf("read service account %s: %w", name, err)
		}
		s := strings.TrimSpace(string(b))
		if s == "" {
			return "", fmt.Errorf("service account %s (%s) is empty", name, filepath.Join(k.saDir, name))
		}
		return s, nil
	}
	var err error
	if c.token, err = read("token"); err != nil {
		return c, err
	}
	if c.namespace, err = read("namespace"); err != nil {
		return c, err
	}
	ca, err := read("ca.crt")
	if err != nil {
		return c, err
	}
	c.roots = x509.NewCertPool()
	if !c.roots.AppendCertsFromPEM([]byte(ca)) {
		return c, fmt.Errorf("service account ca.crt (%s) holds no PEM certificate", filepath.Join(k.saDir, "ca.crt"))
	}
	c.pod = os.Getenv("POD_NAME")
	if c.pod == "" {
		if c.pod, err = os.Hostname(); err != nil {
			return c, fmt.Errorf("pod name: POD_NAME is not set and the host name is unknown: %w", err)
		}
	}
	return c, nil
}

// kubeStatus is the part of a Kubernetes Status the agent reads.
type kubeStatus struct {
	Kind    string `json:"kind"`
	Message string `json:"message"`
	Reason  string `json:"reason"`
	Details struct {
		Name string `json:"name"`
		Kind string `json:"kind"`
	} `json:"details"`
}

// Run deletes the pod: DELETE /api/v1/namespaces/{ns}/pods/{name} with a
// DeleteOptions body that leaves the grace period to the pod's
// terminationGracePeriodSeconds. 200 and 202 are success; so is a 404 that
// the API server gives for this very pod (a Status NotFound naming it): the
// pod is already gone, which is what the action wants, and the control
// plane's verification says whether a new one came. Any other 404 (a wrong
// API base) is an error.
func (k *kubernetesHeal) Run(ctx context.Context, _ HealRequest) error {
	c, err := k.load()
	if err != nil {
		return fmt.Errorf("kubernetes heal: %w", err)
	}
	u := strings.TrimRight(k.apiBase, "/") + "/api/v1/namespaces/" + url.PathEscape(c.namespace) + "/pods/" + url.PathEscape(c.pod)
	body := []byte(`{"kind":"DeleteOptions","apiVersion":"v1"}`)
	req, err := http.NewRequestWithContext(ctx, http.MethodDelete, u, bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("kubernetes heal: %w", err)
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json")
	tr := &http.Transport{
		TLSClientConfig:     &tls.Config{RootCAs: c.roots, MinVersion: tls.VersionTLS12},
		Proxy:               nil, // in-cluster traffic goes straight to the API server
		TLSHandshakeTimeout: 10 * time.Second,
	}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr, Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		return fmt.Errorf("kubernetes heal: delete pod %s/%s: %w", c.namespace, c.pod, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	var st kubeStatus
	_ = json.Unmarshal(raw, &st)
	switch {
	case resp.StatusCode == http.StatusOK || resp.StatusCode == http.StatusAccepted:
		return nil
	case resp.StatusCode == http.StatusNotFound && st.Reason == "NotFound" && st.Details.Kind == "pods" && st.Details.Name == c.pod:
		return nil
	case resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden:
		who := "the pod's service account"
		if sa := serviceAccountOf(c.token); sa != "" {
			who = "service account " + sa
		}
		return fmt.Errorf("kubernetes heal: delete pod %s/%s: %s: %s needs RBAC permission to delete pods in namespace %s "+
			"(a Role with rule apiGroups [\"\"], resources [\"pods\"], verbs [\"delete\"], and a RoleBinding to it)%s",
			c.namespace, c.pod, resp.Status, who, c.namespace, statusText(st, raw))
	default:
		return fmt.Errorf("kubernetes heal: delete pod %s/%s: %s%s", c.namespace, c.pod, resp.Status, statusText(st, raw))
	}
}

func statusText(st kubeStatus, raw []byte) string {
	if st.Kind == "Status" && st.Message != "" {
		return ": " + st.Message
	}
	if t := tail(raw); t != "" {
		return "; body: " + t
	}
	return ""
}

// serviceAccountOf reads, without verifying it, the subject of a
// service-account token ("system:serviceaccount:NS:NAME"), for an error
// message; "" when the token is not such a JWT.
func serviceAccountOf(token string) string {
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return ""
	}
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return ""
	}
	var claims struct {
		Sub string `json:"sub"`
	}
	if json.Unmarshal(payload, &claims) != nil {
		return ""
	}
	ns, name, ok := strings.Cut(strings.TrimPrefix(claims.Sub, "system:serviceaccount:"), ":")
	if !ok || !strings.HasPrefix(claims.Sub, "system:serviceaccount:") {
		return ""
	}
	return ns + "/" + name
}

// noneHeal does nothing: an operator must restart the engine.
type noneHeal struct{}

func (noneHeal) Kind() string { return "none" }

// Run returns ErrHealManual.
func (noneHeal) Run(context.Context, HealRequest) error { return ErrHealManual }
