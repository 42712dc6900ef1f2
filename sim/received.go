package sim

import (
	"net/http"
	"sync"
)

// Received is one generation request as the engine received it: what
// SGLang logs with --log-requests and vLLM with --enable-log-requests, kept
// so that a test can check what a router sent.
type Received struct {
	Path   string
	Header http.Header
	Body   []byte
}

// receivedLog holds the requests received while Config.LogRequests is set.
type receivedLog struct {
	mu   sync.Mutex
	reqs []Received
}

func (l *receivedLog) add(r *http.Request, body []byte) {
	l.mu.Lock()
	l.reqs = append(l.reqs, Received{Path: r.URL.Path, Header: r.Header.Clone(), Body: append([]byte(nil), body...)})
	l.mu.Unlock()
}

// Received returns the generation requests received so far, in order of
// arrival, when Config.LogRequests is set; nil otherwise.
func (s *Sim) Received() []Received {
	s.received.mu.Lock()
	defer s.received.mu.Unlock()
	return append([]Received(nil), s.received.reqs...)
}
