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
