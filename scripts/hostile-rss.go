//go:build ignore

// hostile-rss replays issue 31's memory findings against a built pdplane
// and prints the resident memory (VmRSS, and the peak VmHWM, from /proc) of
// the process under attack before and after each load:
//
//   - registrations: six at once, each a 62 MiB body carrying a 45 MiB
//     agent_metadata, sent to `pdplane serve`; then six at once of 24 MiB
//     (the registration's limit), padded valid JSON, which are read whole;
//   - the transfer listener of a `pdplane sim` decode: 2,000 connections
//     that send only the protocol magic; then 4 connections that pass the
//     handshake with the agent's secret (read from the open control plane)
//     and announce 4,194,304 spans each.
//
// Usage: go build -o /tmp/pdplane ./cmd/pdplane && go run scripts/hostile-rss.go -bin /tmp/pdplane
package main

import (
	"bufio"
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

func main() {
	bin := flag.String("bin", "pdplane", "the pdplane binary")
	flag.Parse()
	if err := run(*bin); err != nil {
		fmt.Fprintln(os.Stderr, "hostile-rss:", err)
		os.Exit(1)
	}
}

func run(bin string) error {
	port, err := freePort()
	if err != nil {
		return err
	}
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	serve, err := start(bin, "serve", "--addr", fmt.Sprintf("127.0.0.1:%d", port), "--log-level", "error")
	if err != nil {
		return err
	}
	defer stop(serve)
	if err := waitFor(func() bool { return get(base+"/healthz", nil) == nil }); err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	sim, err := start(bin, "sim", "--role", "decode", "--control-plane", base, "--log-level", "error")
	if err != nil {
		return err
	}
	defer stop(sim)
	var reg map[string]any
	if err := waitFor(func() bool {
		var list struct {
			Peers []struct{ ID string } `json:"peers"`
		}
		if get(base+"/api/v1/peers", &list) != nil || len(list.Peers) == 0 {
			return false
		}
		return get(base+"/api/v1/peers/"+list.Peers[0].ID+"/registration", &reg) == nil
	}); err != nil {
		return fmt.Errorf("the sim's registration: %w", err)
	}

	// Registrations.
	registration := keep(reg, "name", "role", "engine", "url", "bootstrap_host", "bootstrap_port", "model", "instance_id",
		"transfer_group", "labels", "parallelism", "kv", "ranks", "observed", "unknown")
	rank0 := keep(reg["ranks"].([]any)[0].(map[string]any), "rank", "gpu_id", "agent_name", "agent_metadata", "kv_data_ptrs",
		"kv_data_lens", "kv_item_lens", "kv_mem_kinds", "aux_data_ptrs", "aux_data_lens", "transfer_secret")
	md, _ := base64.StdEncoding.DecodeString(rank0["agent_metadata"].(string))
	body := func(i int, metadata []byte, size int) []byte {
		r := map[string]any{}
		for k, v := range rank0 {
			r[k] = v
		}
		r["agent_name"] = fmt.Sprintf("hostile-%d-agent", i)
		r["agent_metadata"] = base64.StdEncoding.EncodeToString(metadata)
		delete(r, "transfer_secret")
		m := map[string]any{}
		for k, v := range registration {
			m[k] = v
		}
		m["name"], m["ranks"], m["instance_id"] = fmt.Sprintf("hostile-%d", i), []any{r}, fmt.Sprintf("hostile-%d", i)
		b, _ := json.Marshal(m)
		if len(b) < size {
			b = append(b, bytes.Repeat([]byte(" "), size-len(b))...)
		}
		return b
	}
	fmt.Println("## pdplane serve, six registrations at once")
	if err := measure(serve.Process.Pid, "6 x 62 MiB (45 MiB agent_metadata)", func() string {
		return postAll(base, 6, func(i int) []byte { return body(i, bytes.Repeat([]byte{0xA5}, 45<<20), 0) })
	}); err != nil {
		return err
	}
	if err := measure(serve.Process.Pid, "6 x 24 MiB (the limit, padded)", func() string {
		return postAll(base, 6, func(i int) []byte { return body(100+i, md, 24<<20) })
	}); err != nil {
		return err
	}

	// The transfer listener.
	name, addr, instance, regionAddr, err := tcpTarget(md)
	if err != nil {
		return err
	}
	secret, _ := base64.StdEncoding.DecodeString(rank0["transfer_secret"].(string))
	fmt.Printf("## pdplane sim (decode), transfer listener %s\n", addr)
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	if err := measure(sim.Process.Pid, "2,000 connections sending only the magic", func() string {
		closed := 0
		for range 2000 {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				return "dial: " + err.Error()
			}
			c.Write([]byte("PDTH"))
			conns = append(conns, c)
		}
		time.Sleep(time.Second) // held connections are what is measured
		for _, c := range conns {
			c.SetReadDeadline(time.Now().Add(time.Millisecond))
			if _, err := c.Read(make([]byte, 1)); !isTimeout(err) {
				closed++
			}
		}
		return fmt.Sprintf("%d of 2000 closed by the agent within 1 s", closed)
	}); err != nil {
		return err
	}
	for _, c := range conns {
		c.Close()
	}
	conns = nil
	if err := measure(sim.Process.Pid, "4 authenticated connections announcing 4,194,304 spans", func() string {
		var out []string
		for range 4 {
			c, st, err := authenticated(addr, name, instance, secret)
			if err != nil {
				return "handshake: " + err.Error()
			}
			conns = append(conns, c)
			hdr := make([]byte, 24)
			hdr[0] = 1 // a READ
			binary.LittleEndian.PutUint32(hdr[4:], 1<<22)
			binary.LittleEndian.PutUint64(hdr[16:], 1<<22)
			c.Write(hdr)
			// Then the spans themselves (64 MiB), each a byte at the
			// start of the agent's registered memory, while the agent
			// reads them or has refused them.
			go func() {
				span := make([]byte, 16<<10*16)
				for i := 0; i < len(span); i += 16 {
					binary.LittleEndian.PutUint64(span[i:], regionAddr)
					binary.LittleEndian.PutUint64(span[i+8:], 1)
				}
				for range (1 << 22) / (16 << 10) {
					if _, err := c.Write(span); err != nil {
						return
					}
				}
			}()
			c.SetReadDeadline(time.Now().Add(3 * time.Second))
			s, msg, err := readReply(st)
			switch {
			case isTimeout(err):
				out = append(out, "held")
			case err != nil:
				out = append(out, "closed")
			default:
				out = append(out, fmt.Sprintf("refused (%d %q)", s, msg))
			}
		}
		return strings.Join(out, ", ")
	}); err != nil {
		return err
	}
	return nil
}

// measure prints pid's VmRSS before and after load, and its VmHWM after.
func measure(pid int, what string, load func() string) error {
	before, _, err := rss(pid)
	if err != nil {
		return err
	}
	note := load()
	after, hwm, err := rss(pid)
	if err != nil {
		return err
	}
	fmt.Printf("%-58s RSS %4d MB -> %4d MB (peak %4d MB)  %s\n", what, before>>20, after>>20, hwm>>20, note)
	return nil
}

func rss(pid int) (rss, hwm int64, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		for key, p := range map[string]*int64{"VmRSS:": &rss, "VmHWM:": &hwm} {
			if v, ok := strings.CutPrefix(line, key); ok {
				kb, _ := strconv.ParseInt(strings.Fields(v)[0], 10, 64)
				*p = kb << 10
			}
		}
	}
	return rss, hwm, nil
}

// postAll posts n registrations at once and says what came back.
func postAll(base string, n int, body func(int) []byte) string {
	var mu sync.Mutex
	codes := map[int]int{}
	var wg sync.WaitGroup
	for i := range n {
		b := body(i)
		wg.Go(func() {
			resp, err := http.Post(base+"/api/v1/peers", "application/json", bytes.NewReader(b))
			code := -1
			if err == nil {
				code = resp.StatusCode
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
			mu.Lock()
			codes[code]++
			mu.Unlock()
		})
	}
	wg.Wait()
	return fmt.Sprintf("answers %v", codes)
}

func keep(m map[string]any, keys ...string) map[string]any {
	out := map[string]any{}
	for _, k := range keys {
		if v, ok := m[k]; ok {
			out[k] = v
		}
	}
	return out
}

// tcpTarget decodes the name, address, instance and first region's
// address of a TCP agent's metadata ("PDTCPMD1" | u16 name | u16 addr |
// u64 instance | u32 count | u8 kind, u64 addr, ...).
func tcpTarget(md []byte) (string, string, uint64, uint64, error) {
	if !bytes.HasPrefix(md, []byte("PDTCPMD1")) {
		return "", "", 0, 0, errors.New("not tcp metadata")
	}
	b := md[8:]
	str := func() string {
		n := binary.LittleEndian.Uint16(b)
		s := string(b[2 : 2+n])
		b = b[2+n:]
		return s
	}
	name, addr := str(), str()
	return name, addr, binary.LittleEndian.Uint64(b), binary.LittleEndian.Uint64(b[8+4+1:]), nil
}

func appendString(b []byte, s string) []byte {
	return append(binary.LittleEndian.AppendUint16(b, uint16(len(s))), s...)
}

func readReply(r *bufio.Reader) (byte, string, error) {
	var h [3]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return 0, "", err
	}
	msg := make([]byte, binary.LittleEndian.Uint16(h[1:]))
	_, err := io.ReadFull(r, msg)
	return h[0], string(msg), err
}

// authenticated passes the handshake of transfer/tcp/wire.go with secret.
func authenticated(addr, target string, instance uint64, secret []byte) (net.Conn, *bufio.Reader, error) {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return nil, nil, err
	}
	c.SetDeadline(time.Now().Add(5 * time.Second))
	var nonce, targetNonce [32]byte
	rand.Read(nonce[:])
	const initiator = "hostile"
	hello := append([]byte("PDTH"), 2)
	hello = appendString(appendString(hello, initiator), target)
	hello = append(binary.LittleEndian.AppendUint64(hello, instance), nonce[:]...)
	c.Write(hello)
	br := bufio.NewReader(c)
	if st, msg, err := readReply(br); err != nil || st != 0 {
		c.Close()
		return nil, nil, fmt.Errorf("hello: %d %q %v", st, msg, err)
	}
	io.ReadFull(br, targetNonce[:])
	io.ReadFull(br, make([]byte, 32))
	m := hmac.New(sha256.New, secret)
	msg := appendString(nil, "pdplane tcp transfer v2 initiator")
	msg = appendString(appendString(msg, initiator), target)
	msg = binary.LittleEndian.AppendUint64(msg, instance)
	m.Write(append(append(msg, nonce[:]...), targetNonce[:]...))
	c.Write(m.Sum(nil))
	if st, msg, err := readReply(br); err != nil || st != 0 {
		c.Close()
		return nil, nil, fmt.Errorf("proof: %d %q %v", st, msg, err)
	}
	c.SetDeadline(time.Time{})
	return c, br, nil
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func start(bin string, args ...string) (*exec.Cmd, error) {
	cmd := exec.Command(bin, args...)
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	return cmd, cmd.Start()
}

func stop(cmd *exec.Cmd) {
	_ = cmd.Process.Signal(syscall.SIGTERM)
	_ = cmd.Wait()
}

func get(url string, into any) error {
	resp, err := http.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %d", url, resp.StatusCode)
	}
	if into == nil {
		return nil
	}
	return json.NewDecoder(resp.Body).Decode(into)
}

func waitFor(ok func() bool) error {
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if ok() {
			return nil
		}
	}
	return errors.New("timed out")
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}
