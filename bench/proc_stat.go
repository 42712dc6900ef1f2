package bench

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// clockTick is the unit of utime and stime in /proc/<pid>/stat
// (sysconf(_SC_CLK_TCK), 100 on every Linux this runs on).
const clockTick = 10 * time.Millisecond

// Usage is what a process tree (a process and its descendants) holds and
// has spent, read from /proc.
type Usage struct {
	CPU time.Duration // user + system time so far
	RSS int64         // resident bytes (VmRSS)
	FDs int           // open file descriptors
}

// Sub is u − v, field by field.
func (u Usage) Sub(v Usage) Usage {
	return Usage{CPU: u.CPU - v.CPU, RSS: u.RSS - v.RSS, FDs: u.FDs - v.FDs}
}

// ReadUsage sums Usage over pid and its descendants. Python-launched
// routers may run their server in a child process; the tree counts it.
func ReadUsage(pid int) (Usage, error) {
	pids, err := tree(pid)
	if err != nil {
		return Usage{}, err
	}
	var u Usage
	for _, p := range pids {
		cpu, _, err := readStat(p)
		if err != nil {
			if p == pid {
				return Usage{}, err
			}
			continue // a child that just exited
		}
		rss, err := readRSS(p)
		if err != nil && p == pid {
			return Usage{}, err
		}
		fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", p))
		if err != nil && p == pid {
			return Usage{}, fmt.Errorf("list fds of %d: %w", p, err)
		}
		u.CPU += cpu
		u.RSS += rss
		u.FDs += len(fds)
	}
	return u, nil
}

// tree lists pid and its descendants.
func tree(pid int) ([]int, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, fmt.Errorf("list /proc: %w", err)
	}
	children := map[int][]int{}
	for _, e := range entries {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if _, ppid, err := readStat(p); err == nil {
			children[ppid] = append(children[ppid], p)
		}
	}
	out := []int{pid}
	for i := 0; i < len(out); i++ {
		out = append(out, children[out[i]]...)
	}
	return out, nil
}

// readStat returns utime+stime and the parent of pid from
// /proc/<pid>/stat. The command name (field 2) may hold spaces and
// parentheses, so fields are counted after its last ')'.
func readStat(pid int) (cpu time.Duration, ppid int, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0, fmt.Errorf("read stat of %d: %w", pid, err)
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, 0, fmt.Errorf("stat of %d: no command name", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	// f[0] is field 3 (state): ppid is field 4, utime 14, stime 15.
	if len(f) < 13 {
		return 0, 0, fmt.Errorf("stat of %d: %d fields", pid, len(f)+2)
	}
	ppid, err1 := strconv.Atoi(f[1])
	ut, err2 := strconv.ParseInt(f[11], 10, 64)
	st, err3 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil || err3 != nil {
		return 0, 0, fmt.Errorf("stat of %d: malformed", pid)
	}
	return time.Duration(ut+st) * clockTick, ppid, nil
}

// readRSS returns VmRSS of pid in bytes.
func readRSS(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, fmt.Errorf("read status of %d: %w", pid, err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			f := strings.Fields(v) // "1234 kB"
			kb, err := strconv.ParseInt(f[0], 10, 64)
			if err != nil {
				return 0, fmt.Errorf("status of %d: VmRSS %q", pid, v)
			}
			return kb << 10, nil
		}
	}
	return 0, nil // a zombie has no VmRSS
}
