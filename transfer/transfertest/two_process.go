package transfertest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/transfer"
)

// EnvChild makes a test binary run as the child of a two-process test.
const EnvChild = "PDPLANE_TRANSFER_CHILD"

// twoProcessHalf is the size of each area the two processes exchange.
const twoProcessHalf = 4 << 20

// RunTwoProcess runs a transfer between two OS processes. The test binary
// re-executes itself (os.Args[0], running only the calling test) with
// EnvChild set; the two processes exchange agent metadata over the child's
// stdin and stdout, as the control plane would carry it, then:
//
//   - the parent WRITEs to the child with a notification, the child checks
//     the bytes;
//   - the child WRITEs to the parent with a notification, and READs from the
//     parent (the parent is notified), checking the bytes;
//   - both close in order.
//
// The calling test must call RunTwoProcess first thing: in the child it
// never returns.
func RunTwoProcess(t *testing.T, f Factory) {
	if os.Getenv(EnvChild) != "" {
		os.Exit(runChild(t, f))
	}
	runParent(t, f)
}

// line protocol: "PDX <verb> <args...>"
func sendLine(w io.Writer, verb string, args ...string) error {
	_, err := fmt.Fprintf(w, "PDX %s %s\n", verb, strings.Join(args, " "))
	return err
}

func mdLine(a *Agent, md []byte) []string {
	return []string{a.B.AgentName(), strconv.FormatUint(a.Buf.Addr(), 10), strconv.Itoa(a.Buf.Len()), base64.StdEncoding.EncodeToString(md)}
}

type peerInfo struct {
	name string
	addr uint64
	md   []byte
}

func parseMD(args []string) (peerInfo, error) {
	if len(args) != 4 {
		return peerInfo{}, fmt.Errorf("MD line with %d fields", len(args))
	}
	addr, err := strconv.ParseUint(args[1], 10, 64)
	if err != nil {
		return peerInfo{}, err
	}
	md, err := base64.StdEncoding.DecodeString(args[3])
	if err != nil {
		return peerInfo{}, err
	}
	return peerInfo{name: args[0], addr: addr, md: md}, nil
}

// lines reads "PDX" lines from r into a channel, dropping anything else
// (test framework output).
func lines(r io.Reader) <-chan []string {
	ch := make(chan []string, 16)
	go func() {
		defer close(ch)
		sc := bufio.NewScanner(r)
		sc.Buffer(make([]byte, 1<<20), 16<<20)
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			if len(f) >= 2 && f[0] == "PDX" {
				ch <- f[1:]
			}
		}
	}()
	return ch
}

func expect(ch <-chan []string, verb string, timeout time.Duration) ([]string, error) {
	select {
	case l, ok := <-ch:
		if !ok {
			return nil, fmt.Errorf("stream closed waiting for %s", verb)
		}
		if l[0] != verb {
			return nil, fmt.Errorf("got %v waiting for %s", l, verb)
		}
		return l[1:], nil
	case <-time.After(timeout):
		return nil, fmt.Errorf("no %s line within %s", verb, timeout)
	}
}

func dram(addr uint64, n int) transfer.DescList {
	return transfer.DescList{Kind: registry.DRAM, Descs: []transfer.Desc{{Addr: addr, Len: uint64(n)}}}
}

func runParent(t *testing.T, f Factory) {
	const h, timeout = twoProcessHalf, 60 * time.Second
	// Parent memory: [0,h) source of its WRITE, [h,2h) target of the
	// child's WRITE, [2h,3h) source of the child's READ.
	a := NewAgent(t, f, UniqueName("parent"), 3*h)
	Fill(a.Buf.Bytes()[:h], 21)
	Fill(a.Buf.Bytes()[2*h:], 23)

	ctx, cancel := context.WithTimeout(context.Background(), 2*timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^"+regexp.QuoteMeta(t.Name())+"$", "-test.count=1")
	cmd.Env = append(os.Environ(), EnvChild+"=1")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start child: %v", err)
	}
	exited := false
	defer func() {
		if !exited {
			cmd.Process.Kill()
			cmd.Wait()
		}
		if t.Failed() {
			t.Logf("child stderr:\n%s", stderr.String())
		}
	}()
	in := lines(stdout)

	args, err := expect(in, "MD", timeout)
	if err != nil {
		t.Fatalf("child metadata: %v", err)
	}
	child, err := parseMD(args)
	if err != nil {
		t.Fatalf("child metadata: %v", err)
	}
	if err := transfer.LoadPeer(a.B, child.name, child.md); err != nil {
		t.Fatalf("load child metadata: %v", err)
	}
	if err := sendLine(stdin, "MD", mdLine(a, a.Meta(t))...); err != nil {
		t.Fatalf("send metadata: %v", err)
	}
	if err := transfer.Do(ctx, a.B, transfer.Xfer{Op: transfer.OpWrite, Remote: child.name, Local: dram(a.Buf.Addr(), h), Dst: dram(child.addr, h), Notif: []byte("p2c")}); err != nil {
		t.Fatalf("WRITE to the child: %v", err)
	}
	// The child WRITEs and then READs: both notifications may come in one
	// drain.
	if err := AwaitNotifs(a.B, timeout, transfer.Notif{Agent: child.name, Msg: []byte("c2p")}, transfer.Notif{Agent: child.name, Msg: []byte("c-read")}); err != nil {
		t.Fatalf("%v", err)
	}
	if err := Verify(a.Buf.Bytes()[h:2*h], 22); err != nil {
		t.Fatalf("child's WRITE: %v", err)
	}
	args, err = expect(in, "OK", timeout)
	if err != nil {
		t.Fatalf("child result: %v", err)
	}
	_ = args
	if err := sendLine(stdin, "BYE"); err != nil {
		t.Fatalf("send bye: %v", err)
	}
	stdin.Close()
	err = cmd.Wait()
	exited = true
	if err != nil {
		t.Fatalf("child exited: %v", err)
	}
	if err := a.B.InvalidateRemote(child.name); err != nil {
		t.Errorf("invalidate the child: %v", err)
	}
}

// runChild is the child's side; it returns the exit code.
func runChild(t *testing.T, f Factory) int {
	const h, timeout = twoProcessHalf, 60 * time.Second
	out := os.Stdout
	die := func(format string, args ...any) int {
		msg := fmt.Sprintf(format, args...)
		fmt.Fprintln(os.Stderr, "child:", msg)
		sendLine(out, "FAIL", strings.ReplaceAll(msg, "\n", " "))
		return 1
	}
	// Child memory: [0,h) target of the parent's WRITE and then of its own
	// READ, [h,2h) source of its WRITE.
	a := NewAgent(t, f, UniqueName("child"), 2*h)
	defer a.Close(t)
	Fill(a.Buf.Bytes()[h:], 22)
	if err := sendLine(out, "MD", mdLine(a, a.Meta(t))...); err != nil {
		return die("send metadata: %v", err)
	}
	in := lines(os.Stdin)
	args, err := expect(in, "MD", timeout)
	if err != nil {
		return die("parent metadata: %v", err)
	}
	parent, err := parseMD(args)
	if err != nil {
		return die("parent metadata: %v", err)
	}
	if err := transfer.LoadPeer(a.B, parent.name, parent.md); err != nil {
		return die("load parent metadata: %v", err)
	}
	if err := AwaitNotif(a.B, parent.name, []byte("p2c"), timeout); err != nil {
		return die("%v", err)
	}
	if err := Verify(a.Buf.Bytes()[:h], 21); err != nil {
		return die("parent's WRITE: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := transfer.Do(ctx, a.B, transfer.Xfer{Op: transfer.OpWrite, Remote: parent.name, Local: dram(a.Buf.Addr()+h, h), Dst: dram(parent.addr+h, h), Notif: []byte("c2p")}); err != nil {
		return die("WRITE to the parent: %v", err)
	}
	if err := transfer.Do(ctx, a.B, transfer.Xfer{Op: transfer.OpRead, Remote: parent.name, Local: dram(a.Buf.Addr(), h), Dst: dram(parent.addr+2*h, h), Notif: []byte("c-read")}); err != nil {
		return die("READ from the parent: %v", err)
	}
	if err := Verify(a.Buf.Bytes()[:h], 23); err != nil {
		return die("READ from the parent: %v", err)
	}
	if err := sendLine(out, "OK"); err != nil {
		return die("send result: %v", err)
	}
	if _, err := expect(in, "BYE", timeout); err != nil {
		return die("bye: %v", err)
	}
	if err := a.B.InvalidateRemote(parent.name); err != nil {
		return die("invalidate the parent: %v", err)
	}
	a.Close(t)
	if t.Failed() {
		return 1
	}
	return 0
}
