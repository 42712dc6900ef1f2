package transfer

// Log field names used by the transfer packages, so that logs of the
// worker and both backends can be queried the same way.
const (
	LogComponent  = "component"  // "transfer.worker", "transfer.tcp", "transfer.nixl"
	LogAgent      = "agent"      // this agent's name
	LogRemote     = "remote"     // the remote agent's name
	LogPeer       = "peer"       // the peer key (stable across re-registrations)
	LogGeneration = "generation" // the peer generation
	LogRoom       = "room"       // the request's bootstrap room
	LogWorker     = "worker"     // the pool worker index
	LogInitiator  = "initiator"  // the agent that opened a connection
	LogTarget     = "target"     // the agent a connection was opened for
	LogRemoteAddr = "remote_addr"
)
