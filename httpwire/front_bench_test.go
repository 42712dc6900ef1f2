//go:build linux

package httpwire

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"sync"
	"syscall"
	"testing"
	"time"
)

// BenchmarkServerSide measures what the server side of a generation
// request costs, net/http's against the front's: the same handler (read
// the body, answer a small JSON object), the same client (one kept-alive
// connection per goroutine, 32 of them, writing prepared request bytes and
// reading answers with http.ReadResponse), in one process. It reports the
// process's CPU per request (getrusage: user + system, the clients'
// included, which are the same for both) and, for the front, the
// connection watch each request gets (two epoll_ctl calls).
//
//	go test -run '^$' -bench ServerSide -benchtime 20000x -count 3 ./httpwire/
func BenchmarkServerSide(b *testing.B) {
	body := `{"model":"m","messages":[{"role":"user","content":"hello there"}],"max_tokens":16,"stream":false}`
	answer := []byte(`{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"}}]}`)
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(answer)
	})
	for _, front := range []bool{false, true} {
		name := "server=net-http"
		if front {
			name = "server=front"
		}
		b.Run(name, func(b *testing.B) {
			rt := testWatcher(b)
			tcp, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			ln := NewListener(tcp, time.Minute)
			if front && !ln.Front(handler, 10*time.Second, rt) {
				b.Fatal("no connection watcher")
			}
			srv := &http.Server{Handler: handler, ReadHeaderTimeout: 10 * time.Second}
			go func() { _ = srv.Serve(ln) }()
			defer func() {
				_ = srv.Close()
				ln.CloseFront()
			}()
			req := []byte(rawPost("/v1/chat/completions", body))
			const clients = 32
			var next sync.WaitGroup
			work := make(chan struct{}, b.N)
			for range b.N {
				work <- struct{}{}
			}
			close(work)
			before := cpuTime()
			b.ResetTimer()
			for range clients {
				next.Go(func() {
					c, err := net.Dial("tcp", tcp.Addr().String())
					if err != nil {
						b.Error(err)
						return
					}
					defer c.Close()
					br := bufio.NewReader(c)
					for range work {
						if _, err := c.Write(req); err != nil {
							b.Error(err)
							return
						}
						resp, err := http.ReadResponse(br, nil)
						if err != nil {
							b.Error(err)
							return
						}
						_, _ = io.Copy(io.Discard, resp.Body)
						_ = resp.Body.Close()
					}
				})
			}
			next.Wait()
			b.StopTimer()
			b.ReportMetric(float64((cpuTime()-before).Microseconds())/float64(b.N), "cpu-µs/req")
		})
	}
}

// cpuTime is the process's user and system time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
