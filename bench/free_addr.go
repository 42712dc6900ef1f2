package bench

import (
	"net"
	"strconv"
	"testing"
)

// FreeAddr is FreePort as an address on 127.0.0.1, for a test that starts
// a listener there later (a child process, a restarted server): below the
// ephemeral range, no parallel test's outgoing socket takes it meanwhile.
// It fails the test when no port is free.
func FreeAddr(tb testing.TB) string {
	tb.Helper()
	port, err := FreePort()
	if err != nil {
		tb.Fatal(err)
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
}

// ListenFree listens on a free port of 127.0.0.1 below the ephemeral range
// (see FreePort), for a test that will listen on the same address again
// later (a restarted server). A port taken between FreePort's check and
// the listen (another process of a busy test run) is skipped for the next
// one.
func ListenFree(tb testing.TB) net.Listener {
	tb.Helper()
	var err error
	for range 20 {
		var ln net.Listener
		if ln, err = net.Listen("tcp", FreeAddr(tb)); err == nil {
			return ln
		}
	}
	tb.Fatalf("listen on a free port: %v", err)
	return nil
}
