package server_test

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/registry/registrytest"
	"github.com/pdplane/pdplane/server"
	"github.com/pdplane/pdplane/server/api/apiconv"
)

// bodyLimits are the operations' body limits that openapi.yaml declares
// (x-pdplane-max-body), with a path of each.
var bodyLimits = []struct {
	method, path string
	limit        int64
}{
	{"POST", "/api/v1/peers", 24 << 20},
	{"PUT", "/api/v1/peers/6f1c3c55-1111-4222-8333-444455556666/probe", 3 << 20},
	{"POST", "/api/v1/peers/6f1c3c55-1111-4222-8333-444455556666/stale", 1 << 20},
	{"POST", "/api/v1/peers/6f1c3c55-1111-4222-8333-444455556666/heartbeat", 256 << 10},
	{"PUT", "/api/v1/pairs/6f1c3c55-1111-4222-8333-444455556666/6f1c3c55-1111-4222-8333-444455556667/preflight", 64 << 10},
}

// headOnly sends a request head that declares a body of length bytes and
// none of the body, and returns the answer: a server that waited for the
// body would time out instead.
func headOnly(t *testing.T, base, method, path string, length int64) (*http.Response, []byte) {
	t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(c, "%s %s HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n{",
		method, path, strings.TrimPrefix(base, "http://"), adminToken, length)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("%s %s with Content-Length %d and no body: no answer: %v", method, path, length, err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return resp, data
}

// TestBodyOverItsRouteLimitIsRefusedUnread: each /api/v1 operation refuses
// a body one byte over the limit openapi.yaml declares for it with 413
// problem+json naming the limit, from the Content-Length alone (the body
// is never sent), and refuses a chunked body over it too; a body of
// exactly the limit is not refused for its size. The finding: a 62 MiB
// registration was read whole and accepted.
func TestBodyOverItsRouteLimitIsRefusedUnread(t *testing.T) {
	t.Parallel()
	b := setupWith(t, func(c *server.Config, _ *server.Deps) { c.MaxBodyBytes = 0 }) // the spec's limits alone
	for _, l := range bodyLimits {
		resp, data := headOnly(t, b.url, l.method, l.path, l.limit+1)
		if resp.StatusCode != http.StatusRequestEntityTooLarge {
			t.Fatalf("%s %s declaring %d bytes: %d %s", l.method, l.path, l.limit+1, resp.StatusCode, data)
		}
		p := problem(t, resp.Header, data)
		if p.Type != server.ProblemTooLarge || apiconv.Deref(p.Field) != "body" || !strings.Contains(p.Detail, strconv.FormatInt(l.limit, 10)) {
			t.Fatalf("%s %s: %+v, want body-too-large naming %d", l.method, l.path, p, l.limit)
		}

		// Chunked (no Content-Length): cut where it passes the limit.
		over := append([]byte(`{"x":"`), bytes.Repeat([]byte("a"), int(l.limit))...)
		over = append(over, `"}`...)
		req, _ := http.NewRequest(l.method, b.url+l.path, io.MultiReader(bytes.NewReader(over))) // no length known
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+adminToken)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		data, _ = io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != http.StatusRequestEntityTooLarge || !strings.Contains(string(data), strconv.FormatInt(l.limit, 10)) {
			t.Fatalf("%s %s chunked over the limit: %d %s", l.method, l.path, res.StatusCode, data)
		}

		// Exactly the limit: the body is read, and judged on what it says.
		at := append([]byte("{}"), bytes.Repeat([]byte(" "), int(l.limit)-2)...)
		if code, out, _ := b.do(t, l.method, l.path, adminToken, at); code == http.StatusRequestEntityTooLarge {
			t.Fatalf("%s %s with a body of exactly %d bytes: %d %v", l.method, l.path, l.limit, code, out)
		}
	}
}

// TestAgentMetadataIsBounded replays the finding (a 45 MiB agent_metadata,
// accepted): it is 413 from its length, unread, and an agent_metadata a
// byte over registry.MaxAgentMetadata in a body that fits is 422 naming the
// field, while one at the cap registers.
func TestAgentMetadataIsBounded(t *testing.T) {
	t.Parallel()
	b := setupWith(t, func(c *server.Config, _ *server.Deps) { c.MaxBodyBytes = 0 })
	const finding = 45 << 20
	resp, data := headOnly(t, b.url, "POST", "/api/v1/peers", base64Len(finding)+4096)
	if resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Fatalf("a registration carrying 45 MiB of agent metadata: %d %s", resp.StatusCode, data)
	}

	withMetadata := func(name string, n int) registry.PeerSpec {
		s := registrytest.Spec(name, registry.RoleDecode)
		s.Ranks[0].AgentMetadata = bytes.Repeat([]byte{0xA5}, n)
		return s
	}
	code, out, _ := b.do(t, "POST", "/api/v1/peers", joinToken, withMetadata("d-over", registry.MaxAgentMetadata+1))
	if code != http.StatusUnprocessableEntity || out["field"] != "ranks[0].agent_metadata" {
		t.Fatalf("agent metadata a byte over the cap: %d %v", code, out)
	}
	if code, out, _ := b.do(t, "POST", "/api/v1/peers", joinToken, withMetadata("d-at", registry.MaxAgentMetadata)); code != http.StatusCreated {
		t.Fatalf("agent metadata at the cap: %d %v", code, out)
	}
}

func base64Len(n int64) int64 { return int64(base64.StdEncoding.EncodedLen(int(n))) }
