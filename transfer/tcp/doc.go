// Package tcp is pdplane's embedded transfer backend: pure Go, no NIXL, for
// hosts and tests where libnixl_capi.so is absent. It implements
// transfer.Backend over TCP between registered host (DRAM) memory of two
// processes.
//
// Each agent listens on one TCP port. Its metadata (an opaque []byte the
// control plane carries) holds the agent name, the listen address, a random
// instance id and the registered regions. Metadata is published, so it
// opens nothing: each agent also has a transfer secret, which the control
// plane hands only to authenticated peers. An initiator dials the remote's
// address, says hello naming the agent and instance it loaded (a connection
// for another agent, or for a previous instance of it, is refused as a
// stranger), and both sides prove they hold the target's secret with an
// HMAC challenge-response over fresh nonces (the target first, so that no
// byte of KV goes to an impostor; the secret never crosses the wire). Then
// the initiator sends framed requests: a WRITE carries its payload,
// which the target reads straight into its registered memory; a READ is
// answered with the bytes. Both sides check every span against registered
// regions before touching memory. The target queues the notification of a
// transfer only after the bytes are in place (WRITE) or sent (READ).
//
// What a connection can cost the target is bounded before it
// authenticates and after: the handshake must finish within
// Config.HandshakeTimeout, at most Config.MaxHandshakes connections are in
// theirs at once (one more is closed as it is accepted), a connection in
// its handshake holds a 4 KiB buffer, a request carries at most 65,536
// spans (an initiator sends a larger transfer as several), and a request
// for more bytes than the agent has registered, or with more spans than
// bytes, is refused before its spans are read; spans and notifications are
// read as they arrive, never allocated from the header's counts.
//
// It owns the listener, the connection pools and the wire format (wire.go);
// it does not know about KV geometry or the control plane.
package tcp
