package agent

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/pdplane/pdplane/sim/simtest"
)

var testHealRequest = HealRequest{PeerID: "peer-7", Name: "decode-0", Generation: 3, Reason: "missing NIXL memory kind"}

func TestParseHealAction(t *testing.T) {
	for _, tc := range []struct {
		spec, kind, unit string
	}{
		{"exec:true", "exec", ""},
		{"exec:systemctl restart sglang && echo done", "exec", ""},
		{"systemd:sglang-decode", "systemd", "sglang-decode.service"},
		{"systemd:sglang@0.service", "systemd", "sglang@0.service"},
		{"systemd:sglang.decode", "systemd", "sglang.decode.service"},
		{"systemd:engines.target", "systemd", "engines.target"},
		{"none", "none", ""},
	} {
		h, err := ParseHealAction(tc.spec)
		if err != nil {
			t.Errorf("ParseHealAction(%q): %v", tc.spec, err)
			continue
		}
		if h.Kind() != tc.kind {
			t.Errorf("ParseHealAction(%q).Kind() = %q, want %q", tc.spec, h.Kind(), tc.kind)
		}
		if tc.unit != "" && h.(*systemdHeal).unit != tc.unit {
			t.Errorf("ParseHealAction(%q) unit %q, want %q", tc.spec, h.(*systemdHeal).unit, tc.unit)
		}
	}
	for _, tc := range []struct{ spec, want string }{
		{"", "exec:CMD, systemd:UNIT, kubernetes, none"},
		{"bogus", "exec:CMD, systemd:UNIT, kubernetes, none"},
		{"EXEC:true", "exec:CMD, systemd:UNIT, kubernetes, none"},
		{"restart", "exec:CMD, systemd:UNIT, kubernetes, none"},
		{"exec", "needs a command"},
		{"exec:", "needs a command"},
		{"exec:   ", "needs a command"},
		{"systemd", "unit name is required"},
		{"systemd:", "unit name is required"},
		{"systemd:--now", "cannot start with '-'"},
		{"systemd:sglang decode", "not allowed"},
		{"systemd:../sglang", "not allowed"},
		{"systemd:sglang;reboot", "not allowed"},
		{"systemd:.service", "needs a name"},
		{"systemd:" + strings.Repeat("a", 250), "at most 255"},
		{"kubernetes:prod", "takes no argument"},
		{"none:really", "takes no argument"},
	} {
		_, err := ParseHealAction(tc.spec)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParseHealAction(%q) = %v, want an error saying %q", tc.spec, err, tc.want)
		}
	}
}

func TestHealNoneIsManual(t *testing.T) {
	h, err := ParseHealAction("none")
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Run(context.Background(), testHealRequest); !errors.Is(err, ErrHealManual) {
		t.Fatalf("none: Run = %v, want ErrHealManual", err)
	}
}

func TestHealExecRunsOnceWithEnv(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	log := filepath.Join(dir, "runs")
	h, err := ParseHealAction(`exec:echo "$PDPLANE_PEER_ID|$PDPLANE_PEER_NAME|$PDPLANE_GENERATION|$PDPLANE_HEAL_REASON|$EXTRA" >> `+log,
		WithExecEnv(func(r HealRequest) []string { return []string{"EXTRA=for " + r.Name} }))
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Run(context.Background(), testHealRequest); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(log)
	if err != nil {
		t.Fatal(err)
	}
	if want := "peer-7|decode-0|3|missing NIXL memory kind|for decode-0\n"; string(got) != want {
		t.Fatalf("the command ran with %q, want once with %q", got, want)
	}
}

func TestHealExecFailureCarriesOutputTail(t *testing.T) {
	t.Parallel()
	// 5000 bytes of stdout, then the last word on stderr, then exit 3.
	h, err := ParseHealAction(`exec:echo FIRST-LINE; head -c 5000 /dev/zero | tr '\0' x; echo; echo "engine unit not found" >&2; exit 3`)
	if err != nil {
		t.Fatal(err)
	}
	err = h.Run(context.Background(), testHealRequest)
	if err == nil {
		t.Fatal("a command that exits 3 succeeded")
	}
	msg := err.Error()
	if !strings.Contains(msg, "exit status 3") || !strings.Contains(msg, "engine unit not found") {
		t.Errorf("error %q does not carry the exit status and the output's last line", msg)
	}
	if strings.Contains(msg, "FIRST-LINE") || len(msg) > healOutputTail+200 {
		t.Errorf("error carries %d bytes (starting %q), want only the output's tail", len(msg), msg[:min(len(msg), 120)])
	}
}

// processGone says whether pid has exited (gone, or a zombie waiting for a
// parent that does not reap).
func processGone(pid int) bool {
	if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
		return true
	}
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true
	}
	// pid (comm) S ...: the state follows the last ')'.
	s := string(stat)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	return len(fields) > 0 && fields[0] == "Z"
}

func TestHealExecTimeoutKillsProcessGroup(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	pidFile := filepath.Join(dir, "child.pid")
	// The shell's child writes its pid and outlives the shell's own
	// command; killing only the shell would leave it.
	h, err := ParseHealAction(`exec:sleep 1000 & echo $! > ` + pidFile + `.tmp; mv ` + pidFile + `.tmp ` + pidFile + `; wait`)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- h.Run(ctx, testHealRequest) }()
	var pid int
	simtest.WaitFor(t, "the child's pid file", func() bool {
		b, err := os.ReadFile(pidFile)
		if err != nil {
			return false
		}
		pid, err = strconv.Atoi(strings.TrimSpace(string(b)))
		return err == nil
	})
	cancel()
	select {
	case err = <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
	if err == nil || !strings.Contains(err.Error(), "process group killed") {
		t.Fatalf("Run = %v, want an error saying the process group was killed", err)
	}
	simtest.WaitFor(t, "the heal command's child to die", func() bool { return processGone(pid) })
}

func TestHealExecDeadline(t *testing.T) {
	t.Parallel()
	h, err := ParseHealAction(`exec:echo stuck; exec sleep 1000`)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	err = h.Run(ctx, testHealRequest)
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "stuck") {
		t.Fatalf("Run = %v, want deadline exceeded with the output", err)
	}
}

// fakeSystemctl writes a fake of systemctl that records its arguments and
// fails for units named fail*.
func fakeSystemctl(t *testing.T) (path, argsFile string) {
	dir := t.TempDir()
	path, argsFile = filepath.Join(dir, "fake-systemctl"), filepath.Join(dir, "args")
	script := `#!/bin/sh
echo "$@" >> ` + argsFile + `
case "$3" in
fail*) echo "Job for $3 failed because the control process exited with error code." >&2; exit 1;;
esac
`
	if err := os.WriteFile(path, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return path, argsFile
}

func TestHealSystemd(t *testing.T) {
	t.Parallel()
	systemctl, argsFile := fakeSystemctl(t)
	h, err := ParseHealAction("systemd:sglang-decode@0", WithSystemctl(systemctl))
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Run(context.Background(), testHealRequest); err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(argsFile)
	if want := "restart -- sglang-decode@0.service\n"; string(got) != want {
		t.Fatalf("systemctl ran with %q, want once with %q", got, want)
	}

	h, err = ParseHealAction("systemd:failing.service", WithSystemctl(systemctl))
	if err != nil {
		t.Fatal(err)
	}
	err = h.Run(context.Background(), testHealRequest)
	if err == nil || !strings.Contains(err.Error(), "systemctl restart failing.service") ||
		!strings.Contains(err.Error(), "control process exited with error code") {
		t.Fatalf("Run = %v, want an error with the command and systemctl's output", err)
	}
}

// testCA is a certificate authority of the test's own, which signs a
// server certificate for 127.0.0.1.
type testCA struct {
	pem    []byte
	server tls.Certificate
}

func newTestCA(t *testing.T, name string) testCA {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "kubernetes"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage:    x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	return testCA{
		pem:    pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
		server: tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key},
	}
}

// fakeAPIServer is a fake of the Kubernetes API server: it records the
// requests it gets and answers with the status and body set.
type fakeAPIServer struct {
	*httptest.Server
	mu       sync.Mutex
	requests []recordedRequest
	status   int
	body     string
}

type recordedRequest struct{ method, path, auth, contentType, body string }

func newFakeAPIServer(t *testing.T, ca testCA) *fakeAPIServer {
	f := &fakeAPIServer{status: http.StatusOK, body: `{"kind":"Pod","apiVersion":"v1"}`}
	f.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		f.mu.Lock()
		defer f.mu.Unlock()
		f.requests = append(f.requests, recordedRequest{r.Method, r.URL.EscapedPath(), r.Header.Get("Authorization"), r.Header.Get("Content-Type"), string(b)})
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(f.status)
		io.WriteString(w, f.body)
	}))
	f.Server.TLS = &tls.Config{Certificates: []tls.Certificate{ca.server}}
	// The CA test makes handshakes fail on purpose.
	f.Server.Config.ErrorLog = log.New(io.Discard, "", 0)
	f.StartTLS()
	t.Cleanup(f.Close)
	return f
}

func (f *fakeAPIServer) answer(status int, body string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.status, f.body = status, body
}

func (f *fakeAPIServer) last(t *testing.T) recordedRequest {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.requests) == 0 {
		t.Fatal("the fake API server got no request")
	}
	return f.requests[len(f.requests)-1]
}

// serviceAccountDir writes a service-account directory as Kubernetes
// mounts it.
func serviceAccountDir(t *testing.T, ca testCA, token string) string {
	dir := t.TempDir()
	for name, content := range map[string]string{"token": token, "ca.crt": string(ca.pem), "namespace": "llm-serving\n"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// fakeToken is a JWT-shaped token whose subject is a service account (not
// signed: the agent never verifies it).
func fakeToken(sub, serial string) string {
	enc := base64.RawURLEncoding.EncodeToString
	return enc([]byte(`{"alg":"RS256"}`)) + "." + enc([]byte(`{"sub":"`+sub+`","jti":"`+serial+`"}`)) + ".c2ln"
}

func TestHealKubernetesDeletesOwnPod(t *testing.T) {
	t.Setenv("POD_NAME", "sglang-decode-0")
	ca := newTestCA(t, "cluster CA")
	api := newFakeAPIServer(t, ca)
	token1 := fakeToken("system:serviceaccount:llm-serving:pdplane-agent", "1")
	sa := serviceAccountDir(t, ca, token1)
	h, err := ParseHealAction("kubernetes", WithServiceAccountDir(sa), WithKubernetesAPI(api.URL))
	if err != nil {
		t.Fatal(err)
	}
	if h.Kind() != "kubernetes" {
		t.Fatalf("Kind() = %q", h.Kind())
	}
	if err := h.Run(context.Background(), testHealRequest); err != nil {
		t.Fatal(err)
	}
	req := api.last(t)
	if req.method != http.MethodDelete || req.path != "/api/v1/namespaces/llm-serving/pods/sglang-decode-0" ||
		req.auth != "Bearer "+token1 || req.contentType != "application/json" {
		t.Fatalf("the API server got %+v, want DELETE of the pod with the service-account token", req)
	}
	if !strings.Contains(req.body, `"kind":"DeleteOptions"`) || strings.Contains(req.body, "gracePeriodSeconds") {
		t.Errorf("body %s: want DeleteOptions that leave the grace period to the pod", req.body)
	}

	// The kubelet rotates the projected token: the next run reads it again.
	token2 := fakeToken("system:serviceaccount:llm-serving:pdplane-agent", "2")
	if err := os.WriteFile(filepath.Join(sa, "token"), []byte(token2), 0o600); err != nil {
		t.Fatal(err)
	}
	api.answer(http.StatusAccepted, `{"kind":"Pod"}`)
	if err := h.Run(context.Background(), testHealRequest); err != nil {
		t.Fatal(err)
	}
	if got := api.last(t).auth; got != "Bearer "+token2 {
		t.Fatalf("after rotation the agent sent %q, want the new token", got)
	}

	// 404 for this pod: already gone, which is what the action wants.
	api.answer(http.StatusNotFound, `{"kind":"Status","apiVersion":"v1","status":"Failure",`+
		`"message":"pods \"sglang-decode-0\" not found","reason":"NotFound","details":{"name":"sglang-decode-0","kind":"pods"},"code":404}`)
	if err := h.Run(context.Background(), testHealRequest); err != nil {
		t.Fatalf("pod already gone: %v", err)
	}
	// A 404 that is not the API server's word about this pod is an error.
	api.answer(http.StatusNotFound, `404 page not found`)
	if err := h.Run(context.Background(), testHealRequest); err == nil || !strings.Contains(err.Error(), "404 page not found") {
		t.Fatalf("a bare 404: Run = %v, want an error with the body", err)
	}

	api.answer(http.StatusForbidden, `{"kind":"Status","apiVersion":"v1","status":"Failure","message":"pods \"sglang-decode-0\" is forbidden: `+
		`User \"system:serviceaccount:llm-serving:pdplane-agent\" cannot delete resource \"pods\" in API group \"\" in the namespace \"llm-serving\"",`+
		`"reason":"Forbidden","code":403}`)
	err = h.Run(context.Background(), testHealRequest)
	for _, want := range []string{"403", "service account llm-serving/pdplane-agent", `resources ["pods"]`, `verbs ["delete"]`, "namespace llm-serving", "cannot delete resource"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("403: Run = %v, want an error saying %q", err, want)
		}
	}
	api.answer(http.StatusUnauthorized, `{"kind":"Status","message":"Unauthorized","reason":"Unauthorized","code":401}`)
	if err := h.Run(context.Background(), testHealRequest); err == nil || !strings.Contains(err.Error(), `verbs ["delete"]`) {
		t.Errorf("401: Run = %v, want an error naming the RBAC rule", err)
	}
	api.answer(http.StatusInternalServerError, `etcdserver: request timed out`)
	if err := h.Run(context.Background(), testHealRequest); err == nil ||
		!strings.Contains(err.Error(), "500") || !strings.Contains(err.Error(), "etcdserver: request timed out") {
		t.Errorf("500: Run = %v, want an error with the status and the body", err)
	}
}

func TestHealKubernetesVerifiesCA(t *testing.T) {
	t.Setenv("POD_NAME", "sglang-decode-0")
	clusterCA, otherCA := newTestCA(t, "cluster CA"), newTestCA(t, "other CA")
	impostor := newFakeAPIServer(t, otherCA)
	h, err := ParseHealAction("kubernetes", WithServiceAccountDir(serviceAccountDir(t, clusterCA, "token")), WithKubernetesAPI(impostor.URL))
	if err != nil {
		t.Fatal(err)
	}
	err = h.Run(context.Background(), testHealRequest)
	if err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("a server with another CA: Run = %v, want a certificate error", err)
	}
	impostor.mu.Lock()
	defer impostor.mu.Unlock()
	if len(impostor.requests) != 0 {
		t.Fatalf("the token went to a server the cluster CA did not sign: %+v", impostor.requests)
	}
}

func TestHealKubernetesPodNameFallsBackToHostname(t *testing.T) {
	t.Setenv("POD_NAME", "")
	host, err := os.Hostname()
	if err != nil {
		t.Skip(err)
	}
	ca := newTestCA(t, "cluster CA")
	api := newFakeAPIServer(t, ca)
	h, err := ParseHealAction("kubernetes", WithServiceAccountDir(serviceAccountDir(t, ca, "token")), WithKubernetesAPI(api.URL))
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Run(context.Background(), testHealRequest); err != nil {
		t.Fatal(err)
	}
	if got, want := api.last(t).path, "/api/v1/namespaces/llm-serving/pods/"+host; got != want {
		t.Fatalf("path %q, want %q", got, want)
	}
}

func TestParseHealKubernetesOutsideCluster(t *testing.T) {
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	t.Setenv("KUBERNETES_SERVICE_PORT", "")
	if _, err := ParseHealAction("kubernetes"); err == nil || !strings.Contains(err.Error(), "KUBERNETES_SERVICE_HOST") {
		t.Errorf("outside a pod: %v, want an error naming KUBERNETES_SERVICE_HOST", err)
	}
	t.Setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
	t.Setenv("KUBERNETES_SERVICE_PORT", "443")
	if _, err := ParseHealAction("kubernetes", WithServiceAccountDir(t.TempDir())); err == nil || !strings.Contains(err.Error(), "token") {
		t.Errorf("no service-account token: %v, want an error naming the token", err)
	}
}

// TestHealExecBackgroundEngine: a command that starts the engine in the
// background and exits 0 succeeds, though the engine keeps its output open.
func TestHealExecBackgroundEngine(t *testing.T) {
	t.Parallel()
	pidFile := filepath.Join(t.TempDir(), "engine.pid")
	h, err := ParseHealAction(`exec:sleep 1000 & echo $! > ` + pidFile)
	if err != nil {
		t.Fatal(err)
	}
	err = h.Run(context.Background(), testHealRequest)
	if b, rerr := os.ReadFile(pidFile); rerr == nil {
		if pid, perr := strconv.Atoi(strings.TrimSpace(string(b))); perr == nil {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	if err != nil {
		t.Fatalf("Run = %v, want success", err)
	}
}
