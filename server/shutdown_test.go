package server_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/registry/registrytest"
	"github.com/pdplane/pdplane/server"
	"github.com/pdplane/pdplane/sim/simtest"
)

// TestShutdownEndsStreamsAndReadiness: BeginShutdown turns /readyz to 503,
// ends an open event stream with a last comment and EOF, and refuses a new
// stream with 503 and Retry-After; other requests are still answered.
func TestShutdownEndsStreamsAndReadiness(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, s := range []registry.PeerSpec{registrytest.Spec("p0", registry.RolePrefill), registrytest.Spec("d0", registry.RoleDecode)} {
		p := b.register(t, s)
		b.heartbeat(t, p["id"].(string), s.InstanceID)
	}
	simtest.WaitFor(t, "a routable pair", func() bool { ok, _ := b.mirror.Snapshot().Routable(); return ok })
	if code, _, _ := b.raw(t, "GET", "/readyz", ""); code != http.StatusOK {
		t.Fatalf("readyz before shutdown: %d", code)
	}
	stream := b.openStream(t, context.Background())
	defer stream.Body.Close()
	rest := make(chan string, 1)
	go func() {
		data, _ := io.ReadAll(stream.Body)
		rest <- string(data)
	}()
	if b.srv.ShuttingDown() {
		t.Fatal("shutting down before BeginShutdown")
	}

	b.srv.BeginShutdown()
	b.srv.BeginShutdown() // idempotent
	select {
	case data := <-rest:
		if !strings.HasSuffix(data, ": pdplane is shutting down\n\n") {
			t.Fatalf("stream ended without the shutdown comment: %q", data)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the event stream did not end at BeginShutdown")
	}
	if code, _, data := b.raw(t, "GET", "/readyz", ""); code != http.StatusServiceUnavailable || !strings.Contains(string(data), "shutting down") {
		t.Fatalf("readyz while shutting down: %d %q", code, data)
	}
	b.wantStreamRefused(t, "new stream while shutting down", server.ProblemUnavailable, "shutting_down")
	simtest.WaitFor(t, "the stream gauge to drop", func() bool { return b.gauge(t, "pdplane_api_event_streams", nil) == 0 })
	if code, _, _ := b.do(t, "GET", "/api/v1/peers", "", nil); code != http.StatusOK {
		t.Fatalf("list peers while shutting down: %d", code)
	}
}
