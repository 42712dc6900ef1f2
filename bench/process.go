package bench

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// outputTail is how much of a process's output a Process keeps.
const outputTail = 64 << 10

// Process is a child process whose output is kept (its last 64 KiB) for
// the report when something goes wrong.
type Process struct {
	Name string // names the process in errors and logs
	cmd  *exec.Cmd
	out  tailBuffer
	done chan struct{}
	err  error
}

// Start runs argv[0] with argv[1:] and the extra environment env (on top
// of this process's, with colours off).
func Start(name string, env []string, argv ...string) (*Process, error) {
	if len(argv) == 0 {
		return nil, fmt.Errorf("start %s: empty command line", name)
	}
	p := &Process{Name: name, done: make(chan struct{})}
	p.cmd = exec.Command(argv[0], argv[1:]...)
	p.cmd.Stdout, p.cmd.Stderr = &p.out, &p.out
	p.cmd.Env = append(append(os.Environ(), "NO_COLOR=1", "RUST_LOG_STYLE=never"), env...)
	// Its own process group, so that Stop ends whatever it started too
	// (a Python launcher's server, for one).
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	go func() {
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// PID is the process id.
func (p *Process) PID() int { return p.cmd.Process.Pid }

// Output is the last of what the process wrote to stdout and stderr.
func (p *Process) Output() string { return p.out.String() }

// Exited reports whether the process has ended, and how.
func (p *Process) Exited() (bool, error) {
	select {
	case <-p.done:
		return true, p.err
	default:
		return false, nil
	}
}

// Stop kills the process and its process group and waits for it. It is
// idempotent.
func (p *Process) Stop() {
	select {
	case <-p.done:
		return
	default:
	}
	_ = syscall.Kill(-p.PID(), syscall.SIGKILL)
	<-p.done
}

// StopGrace sends the process group SIGTERM, so that a process that
// cleans up at exit (vLLM frees its shared memory) may, and kills it after
// grace if it has not ended. It is idempotent.
func (p *Process) StopGrace(grace time.Duration) {
	select {
	case <-p.done:
		return
	default:
	}
	_ = syscall.Kill(-p.PID(), syscall.SIGTERM)
	select {
	case <-p.done:
		// The leader is gone; what it started may not be.
		_ = syscall.Kill(-p.PID(), syscall.SIGKILL)
	case <-time.After(grace):
		p.Stop()
	}
}

// tailBuffer keeps the last outputTail bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	buf []byte
}

func (b *tailBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf = append(b.buf, p...)
	if over := len(b.buf) - outputTail; over > 0 {
		b.buf = append(b.buf[:0], b.buf[over:]...)
	}
	return len(p), nil
}

func (b *tailBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return string(b.buf)
}

// Ports FreePort hands out: below Linux's default ephemeral range
// (32768-60999), so that the kernel never gives one to a listener on port 0
// or to an outgoing connection between FreePort's check and the child's
// bind. With many tests running at once on a small machine, a port taken
// from the ephemeral range was lost that way.
const (
	lowPortFirst = 20000
	lowPortCount = 12000
)

// FreePort returns a TCP port free on 127.0.0.1 at the time of the call,
// for a child process to listen on. It picks at random below the
// ephemeral range, so that parallel tests rarely try the same one.
func FreePort() (int, error) {
	for range 200 {
		p := lowPortFirst + rand.IntN(lowPortCount)
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err != nil {
			continue // taken
		}
		l.Close()
		return p, nil
	}
	return 0, fmt.Errorf("find a free port: none of 200 tried in %d-%d was free", lowPortFirst, lowPortFirst+lowPortCount-1)
}

// WaitHTTP polls GET url until it answers 200, ctx ends, or p (when not
// nil) exits.
func WaitHTTP(ctx context.Context, url string, p *Process) error {
	var last string
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			last = fmt.Sprintf("%d %s", resp.StatusCode, b)
		} else {
			last = err.Error()
		}
		if p != nil {
			if exited, err := p.Exited(); exited {
				return fmt.Errorf("%s exited (%v) before %s answered 200: %s", p.Name, err, url, tail(p.Output(), 2000))
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s never answered 200: %s: %w", url, last, context.Cause(ctx))
		case <-tick.C:
		}
	}
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "…" + s[len(s)-n:]
}

// BuildPdplane builds the pdplane command at pkg (a package path such as
// "../cmd/pdplane") into a temporary directory, for tests that run it as a
// process. It returns the binary and a function that removes it.
func BuildPdplane(pkg string) (bin string, remove func(), err error) {
	dir, err := os.MkdirTemp("", "pdplane-bin-")
	if err != nil {
		return "", nil, fmt.Errorf("build pdplane: %w", err)
	}
	remove = func() { _ = os.RemoveAll(dir) }
	bin = filepath.Join(dir, "pdplane")
	build := exec.Command("go", "build", "-o", bin, pkg)
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		remove()
		return "", nil, fmt.Errorf("build pdplane: %w", err)
	}
	return bin, remove, nil
}

// RunWithPdplane builds the pdplane command at pkg, calls run with the
// binary's path, removes the binary and returns run's exit code; a failed
// build is reported on stderr and returns 1. It is the body of a TestMain
// for tests that run pdplane as a process:
//
//	os.Exit(bench.RunWithPdplane("../cmd/pdplane", func(bin string) int {
//		pdplaneBin = bin
//		return m.Run()
//	}))
func RunWithPdplane(pkg string, run func(bin string) int) int {
	bin, remove, err := BuildPdplane(pkg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer remove()
	return run(bin)
}
