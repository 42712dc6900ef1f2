package bench

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Floor is a baseline for the harness, not a router: the least a Go
// process does to carry SGLang's PD protocol between HTTP/1.1 clients and
// one prefill and one decode, so that what a router spends above it can be
// told apart from what Go's runtime and the kernel cost any router written
// in Go on the same machine.
//
// Per request it reads the client's head and body, appends the prefill's
// bootstrap address and a fresh room to the JSON body (as SGLang's router
// does; python/sglang/srt/disaggregation/ and SMG's PD router), writes the
// same body to both engines at once over kept-alive connections, discards
// the prefill's answer, and relays the decode's answer verbatim: a
// Content-Length answer whole, a chunked one as it arrives (one write to
// the client per read from the decode). It has no validation, picking,
// retries, deadlines, metrics or logs, reads only the header fields it
// needs, and trusts the engines: it is a measuring stick for well-formed
// traffic between processes of the harness, never to be exposed.
//
// With NetHTTP set, net/http's server reads the clients' requests and
// writes their answers (the relay flushing whenever what the decode sent is
// used up), so that the floor can be measured with and without it.
type Floor struct {
	Prefill, Decode string // engines' host:port
	BootstrapPort   int    // the prefill's bootstrap port (its host is Prefill's)
	NetHTTP         bool

	bootstrapHost string
	room          atomic.Uint64
	prefill       connPool
	decode        connPool
}

// Serve accepts connections on ln until it fails.
func (f *Floor) Serve(ln net.Listener) error {
	f.prefill.addr, f.decode.addr = f.Prefill, f.Decode
	host, _, err := net.SplitHostPort(f.Prefill)
	if err != nil {
		return fmt.Errorf("floor: prefill %q: %w", f.Prefill, err)
	}
	f.bootstrapHost = host
	if f.NetHTTP {
		return (&http.Server{Handler: http.HandlerFunc(f.serveHTTP), ReadHeaderTimeout: time.Minute}).Serve(ln)
	}
	for {
		c, err := ln.Accept()
		if err != nil {
			return err
		}
		go f.serveConn(c)
	}
}

// maxFloorBody bounds a request's body, an answer's, and a chunk.
const maxFloorBody = 64 << 20

// floorReq is one client request as the floor reads it.
type floorReq struct {
	line  []byte // request line, "POST /path HTTP/1.1"
	body  []byte
	close bool // the client asked to close after it
}

func (f *Floor) serveConn(c net.Conn) {
	defer c.Close()
	br := bufio.NewReaderSize(c, 4096)
	for {
		q, err := readFloorRequest(br)
		if err != nil {
			return
		}
		if err := f.relay(c, q); err != nil || q.close {
			return
		}
	}
}

// relay serves q: both legs at once, the decode's answer to the client.
func (f *Floor) relay(client net.Conn, q floorReq) error {
	head, body, err := f.upstream(q.line, q.body)
	if err != nil {
		return err
	}
	return f.both(head, body, func(br *bufio.Reader) (bool, error) { return relayAnswer(br, client) })
}

// serveHTTP is relay on net/http's server.
func (f *Floor) serveHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxFloorBody))
	if err != nil {
		return
	}
	head, up, err := f.upstream([]byte(r.Method+" "+r.URL.RequestURI()+" HTTP/1.1"), body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if err := f.both(head, up, func(br *bufio.Reader) (bool, error) { return relayToHTTP(br, w) }); err != nil {
		panic(http.ErrAbortHandler)
	}
}

// both sends the request to both engines at once, discarding the
// prefill's answer and handing the decode's to relay.
func (f *Floor) both(head, body []byte, relay answerReader) error {
	prefillDone := make(chan error, 1)
	go func() {
		prefillDone <- f.prefill.exchange(head, body, func(br *bufio.Reader) (bool, error) { return relayAnswer(br, nil) })
	}()
	err := f.decode.exchange(head, body, relay)
	if perr := <-prefillDone; err == nil {
		err = perr
	}
	return err
}

// upstream is the engines' request head and body for a client's request
// line and JSON body: the body with the bootstrap address and a fresh room.
func (f *Floor) upstream(line, body []byte) (head, upBody []byte, err error) {
	body = bytes.TrimRight(body, " \t\r\n")
	if len(body) < 2 || body[len(body)-1] != '}' {
		return nil, nil, errors.New("floor: the body is not a JSON object")
	}
	room := f.room.Add(1)
	upBody = append(append([]byte(nil), body[:len(body)-1]...), `,"bootstrap_host":"`...)
	upBody = append(upBody, f.bootstrapHost...)
	upBody = append(upBody, `","bootstrap_port":`...)
	upBody = strconv.AppendInt(upBody, int64(f.BootstrapPort), 10)
	upBody = append(upBody, `,"bootstrap_room":`...)
	upBody = strconv.AppendUint(upBody, room, 10)
	upBody = append(upBody, '}')
	head = append([]byte(nil), line...)
	head = append(head, "\r\nHost: engine\r\nContent-Type: application/json\r\nContent-Length: "...)
	head = strconv.AppendInt(head, int64(len(upBody)), 10)
	head = append(head, "\r\n\r\n"...)
	return head, upBody, nil
}

// readFloorRequest reads one request's head and its Content-Length body.
func readFloorRequest(br *bufio.Reader) (floorReq, error) {
	var q floorReq
	line, err := readLine(br)
	if err != nil {
		return q, err
	}
	q.line = append([]byte(nil), line...)
	h, err := readFields(br, nil, nil)
	if err != nil {
		return q, err
	}
	q.close = h.close
	n := h.length
	if n < 0 {
		return q, errors.New("floor: a request without Content-Length")
	}
	q.body = make([]byte, n)
	_, err = io.ReadFull(br, q.body)
	return q, err
}

// readLine reads a CRLF-terminated line, without its end; the slice is
// valid until the next read.
func readLine(br *bufio.Reader) ([]byte, error) {
	line, err := br.ReadSlice('\n')
	if err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(line[:len(line)-1], []byte("\r")), nil
}

// floorHead is what the floor reads of a head's fields.
type floorHead struct {
	length  int // Content-Length, -1 without one
	chunked bool
	close   bool // Connection: close
}

// readFields reads a head's fields, up to and with its empty line. It
// appends each line with its CRLF to raw, and sets contentType, when they
// are not nil.
func readFields(br *bufio.Reader, raw *[]byte, contentType *string) (floorHead, error) {
	h := floorHead{length: -1}
	for {
		line, err := readLine(br)
		if err != nil {
			return h, err
		}
		if raw != nil {
			*raw = append(append(*raw, line...), '\r', '\n')
		}
		if len(line) == 0 {
			return h, nil
		}
		name, value, _ := bytes.Cut(line, []byte(":"))
		value = bytes.TrimSpace(value)
		switch {
		case bytes.EqualFold(name, []byte("Content-Length")):
			if h.length, err = strconv.Atoi(string(value)); err != nil || h.length < 0 || h.length > maxFloorBody {
				return h, fmt.Errorf("floor: bad or too large Content-Length %q", value)
			}
		case bytes.EqualFold(name, []byte("Transfer-Encoding")):
			h.chunked = bytes.EqualFold(value, []byte("chunked"))
		case bytes.EqualFold(name, []byte("Connection")):
			h.close = bytes.EqualFold(value, []byte("close"))
		case contentType != nil && bytes.EqualFold(name, []byte("Content-Type")):
			*contentType = string(value)
		}
	}
}

// connPool keeps idle connections to one engine.
type connPool struct {
	addr string
	mu   sync.Mutex
	idle []*floorConn
}

type floorConn struct {
	c  net.Conn
	br *bufio.Reader
}

func (p *connPool) get() (*floorConn, error) {
	p.mu.Lock()
	if n := len(p.idle); n > 0 {
		fc := p.idle[n-1]
		p.idle = p.idle[:n-1]
		p.mu.Unlock()
		return fc, nil
	}
	p.mu.Unlock()
	c, err := net.Dial("tcp", p.addr)
	if err != nil {
		return nil, err
	}
	return &floorConn{c: c, br: bufio.NewReaderSize(c, 4096)}, nil
}

func (p *connPool) put(fc *floorConn) {
	p.mu.Lock()
	p.idle = append(p.idle, fc)
	p.mu.Unlock()
}

// answerReader reads one answer; closeAfter is the engine's Connection:
// close.
type answerReader func(*bufio.Reader) (closeAfter bool, err error)

// exchange sends one request to the pool's engine and has read read its
// answer. The connection goes back to the pool after a whole answer,
// unless the engine closes it.
func (p *connPool) exchange(head, body []byte, read answerReader) error {
	fc, err := p.get()
	if err != nil {
		return err
	}
	bufs := net.Buffers{head, body}
	if _, err := bufs.WriteTo(fc.c); err != nil {
		fc.c.Close()
		return err
	}
	closeAfter, err := read(fc.br)
	if err != nil || closeAfter {
		fc.c.Close()
		return err
	}
	p.put(fc)
	return nil
}

// relayAnswer reads one answer from br; with a client, it writes the same
// bytes to it: the head and a Content-Length body at once, a chunked body
// each time what was read is used up. Without one, it reads the answer
// away.
func relayAnswer(br *bufio.Reader, client net.Conn) (closeAfter bool, err error) {
	var out []byte
	// keep copies a line read to out when relaying.
	keep := func(line []byte) {
		if client != nil {
			out = append(append(out, line...), '\r', '\n')
		}
	}
	// take reads the next n bytes into out when relaying, else away.
	take := func(n int) error {
		if client == nil {
			_, err := br.Discard(n)
			return err
		}
		start := len(out)
		out = slices.Grow(out, n)[:start+n]
		_, err := io.ReadFull(br, out[start:])
		return err
	}
	line, err := readLine(br)
	if err != nil {
		return false, err
	}
	keep(line)
	var raw *[]byte
	if client != nil {
		raw = &out
	}
	h, err := readFields(br, raw, nil)
	if err != nil {
		return false, err
	}
	if !h.chunked {
		if h.length < 0 {
			return false, errors.New("floor: an answer with neither Content-Length nor chunked")
		}
		if err := take(h.length); err != nil {
			return false, err
		}
		return h.close, write(client, out)
	}
	// Chunked: copy chunk by chunk, writing whenever nothing more is
	// buffered (the next read would wait on the decode).
	for {
		line, err := readLine(br)
		if err != nil {
			return false, err
		}
		keep(line)
		size, err := strconv.ParseUint(string(bytes.TrimSpace(line)), 16, 31)
		if err != nil || size > maxFloorBody {
			return false, fmt.Errorf("floor: bad chunk size %q", line)
		}
		if err := take(int(size) + 2); err != nil { // the data and its CRLF
			return false, err
		}
		if size == 0 { // the last chunk; the floor's engines send no trailers
			return h.close, write(client, out)
		}
		if br.Buffered() == 0 || len(out) >= 64<<10 {
			if err := write(client, out); err != nil {
				return false, err
			}
			out = out[:0]
		}
	}
}

// relayToHTTP reads one answer from br and answers w with it: its status
// and Content-Type, and its body, flushed whenever what was read is used
// up.
func relayToHTTP(br *bufio.Reader, w http.ResponseWriter) (closeAfter bool, err error) {
	line, err := readLine(br)
	if err != nil {
		return false, err
	}
	_, code, _ := bytes.Cut(line, []byte(" "))
	status, err := strconv.Atoi(string(code[:min(3, len(code))]))
	if err != nil {
		return false, fmt.Errorf("floor: bad status line %q", line)
	}
	var contentType string
	h, err := readFields(br, nil, &contentType)
	if err != nil {
		return false, err
	}
	if contentType != "" {
		w.Header().Set("Content-Type", contentType)
	}
	var body io.Reader
	switch {
	case h.chunked:
		body = httputil.NewChunkedReader(br)
	case h.length >= 0:
		w.Header().Set("Content-Length", strconv.Itoa(h.length))
		body = io.LimitReader(br, int64(h.length))
	default:
		return false, errors.New("floor: an answer with neither Content-Length nor chunked")
	}
	w.WriteHeader(status)
	fl := w.(http.Flusher)
	buf := make([]byte, 4096)
	for {
		k, err := body.Read(buf)
		if k > 0 {
			if _, werr := w.Write(buf[:k]); werr != nil {
				return false, werr
			}
			if br.Buffered() == 0 && err == nil {
				fl.Flush()
			}
		}
		if err == io.EOF {
			err = nil
			if h.chunked { // the chunked reader leaves the last chunk's CRLF
				_, err = readLine(br)
			}
			return h.close, err
		}
		if err != nil {
			return false, err
		}
	}
}

func write(c net.Conn, b []byte) error {
	if c == nil || len(b) == 0 {
		return nil
	}
	_, err := c.Write(b)
	return err
}
