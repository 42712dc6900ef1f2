package bench

import (
	"os"
	"os/exec"
	"testing"
	"time"
)

// TestBenchReadUsageCountsChildren reads this process's tree with a child
// that holds extra descriptors: the child's are counted with the parent's.
func TestBenchReadUsageCountsChildren(t *testing.T) {
	alone, err := ReadUsage(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if alone.RSS <= 0 || alone.FDs <= 0 {
		t.Fatalf("this process: %+v, want RSS and fds", alone)
	}
	child := exec.Command("sleep", "60")
	if err := child.Start(); err != nil {
		t.Skipf("no sleep command: %v", err)
	}
	t.Cleanup(func() { _ = child.Process.Kill(); _ = child.Wait() })
	childUsage, err := ReadUsage(child.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	both, err := ReadUsage(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if both.RSS < childUsage.RSS || both.FDs < childUsage.FDs+1 {
		t.Fatalf("tree %+v does not include the child %+v", both, childUsage)
	}
}

func TestBenchPercentile(t *testing.T) {
	t.Parallel()
	ds := make([]time.Duration, 100)
	for i := range ds {
		ds[i] = time.Duration(100-i) * time.Millisecond
	}
	for _, c := range []struct {
		p    float64
		want time.Duration
	}{{50, 50 * time.Millisecond}, {99, 99 * time.Millisecond}, {100, 100 * time.Millisecond}, {1, time.Millisecond}} {
		if got := percentile(ds, c.p); got != c.want {
			t.Errorf("p%v = %v, want %v", c.p, got, c.want)
		}
	}
	if got := percentile(nil, 50); got != 0 {
		t.Errorf("p50 of nothing = %v, want 0", got)
	}
}
