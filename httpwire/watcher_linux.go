package httpwire

import (
	"errors"
	"net"
	"sync"
	"syscall"
	"time"
)

// Watcher watches the client connections of taken-over streams, all of
// them from one goroutine, through an epoll set of its own (beside the Go
// runtime's, which the connections stay in for the router's writes): a
// held stream costs no goroutine for it. Each connection is watched for
// one event at a time (EPOLLONESHOT): readable (bytes, or the client's
// end of the connection) or hung up. Its bytes are only peeked at, never
// read: they are the client's next request, for the server to read.
type Watcher struct {
	epfd int
	wake [2]int // a pipe: a byte on it ends the loop (stop)

	mu     sync.Mutex
	conns  map[int32]*Stream
	next   int32
	closed bool
}

// idleSweep is how often the watcher closes idle connections whose idle
// time has passed.
const idleSweep = time.Second

const watchEvents = syscall.EPOLLIN | syscall.EPOLLRDHUP | syscall.EPOLLONESHOT

// wakeToken is the pipe's token; connections get 1 and up.
const wakeToken = 0

func NewWatcher() (*Watcher, error) {
	epfd, err := syscall.EpollCreate1(syscall.EPOLL_CLOEXEC)
	if err != nil {
		return nil, err
	}
	w := &Watcher{epfd: epfd, conns: map[int32]*Stream{}}
	if err := syscall.Pipe2(w.wake[:], syscall.O_CLOEXEC|syscall.O_NONBLOCK); err != nil {
		_ = syscall.Close(epfd)
		return nil, err
	}
	ev := syscall.EpollEvent{Events: syscall.EPOLLIN, Fd: wakeToken}
	if err := syscall.EpollCtl(epfd, syscall.EPOLL_CTL_ADD, w.wake[0], &ev); err != nil {
		w.closeFDs()
		return nil, err
	}
	go w.loop()
	return w, nil
}

func (w *Watcher) closeFDs() {
	_ = syscall.Close(w.wake[0])
	_ = syscall.Close(w.wake[1])
	_ = syscall.Close(w.epfd)
}

// control runs f on tc's descriptor while it is open.
func control(tc *Stream, f func(fd int)) error {
	sc, ok := tc.w.(syscall.Conn)
	if !ok {
		return errors.New("not a socket")
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return err
	}
	return raw.Control(func(fd uintptr) { f(int(fd)) })
}

// add starts watching tc.
func (w *Watcher) add(tc *Stream) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return net.ErrClosed
	}
	for {
		w.next++
		if w.next <= wakeToken {
			w.next = wakeToken + 1
		}
		if _, used := w.conns[w.next]; !used {
			break
		}
	}
	tok := w.next
	var cerr error
	err := control(tc, func(fd int) {
		ev := syscall.EpollEvent{Events: watchEvents, Fd: tok}
		cerr = syscall.EpollCtl(w.epfd, syscall.EPOLL_CTL_ADD, fd, &ev)
	})
	if err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	tc.token = tok
	w.conns[tok] = tc
	return nil
}

// remove stops watching tc; it must come before the connection is closed.
func (w *Watcher) remove(tc *Stream) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed || tc.token == 0 || w.conns[tc.token] != tc {
		return
	}
	delete(w.conns, tc.token)
	tc.token = 0
	_ = control(tc, func(fd int) { _ = syscall.EpollCtl(w.epfd, syscall.EPOLL_CTL_DEL, fd, nil) })
}

// rearm watches tc for its next event after one that was not (a readiness
// that went away before it was looked at).
func (w *Watcher) rearm(tc *Stream) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed || tc.token == 0 || w.conns[tc.token] != tc {
		return
	}
	tok := tc.token
	_ = control(tc, func(fd int) {
		ev := syscall.EpollEvent{Events: watchEvents, Fd: tok}
		_ = syscall.EpollCtl(w.epfd, syscall.EPOLL_CTL_MOD, fd, &ev)
	})
}

// stopped reports whether the loop has ended (stopped, or epoll failed).
func (w *Watcher) stopped() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.closed
}

// Stop ends the loop. Streams still watched are left to their owners
// (the router cuts them first: Streams.CutAll); connections parked
// between requests are closed, as nothing would hand them back or expire them any more.
func (w *Watcher) Stop() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.closed {
		w.closed = true
		_, _ = syscall.Write(w.wake[1], []byte{1})
	}
}

func (w *Watcher) loop() {
	defer func() {
		// Stopped, or epoll failed: nothing is watched from here (add
		// fails, so new takeovers close their connections after their
		// stream), and no descriptor number of the set is used again.
		w.mu.Lock()
		w.closed = true
		left := w.conns
		w.conns = map[int32]*Stream{}
		w.closeFDs()
		w.mu.Unlock()
		for _, tc := range left {
			tc.closeIfIdle() // a stream ending later closes its own (Stream.end)
		}
	}()
	events := make([]syscall.EpollEvent, 128)
	lastSweep := time.Now()
	for {
		n, err := syscall.EpollWait(w.epfd, events, int(idleSweep/time.Millisecond))
		if err != nil && !errors.Is(err, syscall.EINTR) {
			return
		}
		for _, ev := range events[:max(n, 0)] {
			if ev.Fd == wakeToken {
				return
			}
			w.mu.Lock()
			tc := w.conns[ev.Fd]
			w.mu.Unlock()
			if tc == nil {
				continue
			}
			switch peek(tc) {
			case peekData:
				tc.onReadable(true)
			case peekGone:
				tc.onReadable(false)
			default:
				w.rearm(tc)
			}
		}
		if now := time.Now(); now.Sub(lastSweep) >= idleSweep {
			lastSweep = now
			w.sweep(now)
		}
	}
}

// sweep closes the idle connections whose idle time has passed.
func (w *Watcher) sweep(now time.Time) {
	w.mu.Lock()
	idle := make([]*Stream, 0, 16)
	for _, tc := range w.conns {
		idle = append(idle, tc)
	}
	w.mu.Unlock()
	for _, tc := range idle {
		tc.expire(now)
	}
}

type peekResult uint8

const (
	peekNothing peekResult = iota // nothing to read yet
	peekData                      // the client sent bytes
	peekGone                      // the client's end of the connection, or an error
)

// peek looks at what the client's side of tc has, without reading it.
func peek(tc *Stream) peekResult {
	res := peekGone
	_ = control(tc, func(fd int) {
		var b [1]byte
		n, _, err := syscall.Recvfrom(fd, b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		switch {
		case n > 0:
			res = peekData
		case err != nil && (errors.Is(err, syscall.EAGAIN) || errors.Is(err, syscall.EINTR)):
			res = peekNothing
		}
	})
	return res
}
