package bench_test

import (
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/pdplane/pdplane/bench"
)

// TestRaiseFDLimitReachesChildren: after RaiseFDLimit, a process the
// harness starts runs with the soft limit on open files at the hard limit,
// even when this process's soft limit was lower (Go alone raises its own
// limit but starts children with the original one). Not parallel: it
// lowers this process's limit for a moment, which no parallel test runs
// under (parallel tests start once every serial one has ended).
func TestRaiseFDLimitReachesChildren(t *testing.T) {
	var orig syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &orig); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &orig) })
	low := syscall.Rlimit{Cur: min(orig.Max, 1024), Max: orig.Max}
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &low); err != nil {
		t.Fatal(err)
	}
	limit, err := bench.RaiseFDLimit()
	if err != nil || limit != orig.Max {
		t.Fatalf("RaiseFDLimit = %d, %v; want the hard limit %d", limit, err, orig.Max)
	}
	p, err := bench.Start("sleep", nil, "sleep", "60")
	if err != nil {
		t.Fatal(err)
	}
	defer p.Stop()
	soft, hard := openFilesLimits(t, p.PID())
	if soft != orig.Max || hard != orig.Max {
		t.Fatalf("the child's open-files limit is %d (hard %d), want the hard limit %d", soft, hard, orig.Max)
	}
}

// openFilesLimits reads a process's "Max open files" from /proc.
func openFilesLimits(t *testing.T, pid int) (soft, hard uint64) {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/limits")
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(b)) {
		rest, ok := strings.CutPrefix(line, "Max open files")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) < 2 {
			break
		}
		soft, err1 := strconv.ParseUint(f[0], 10, 64)
		hard, err2 := strconv.ParseUint(f[1], 10, 64)
		if err1 != nil || err2 != nil {
			break
		}
		return soft, hard
	}
	t.Fatalf("no open-files limit in /proc/%d/limits:\n%s", pid, b)
	return 0, 0
}
