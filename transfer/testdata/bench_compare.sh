#!/usr/bin/env bash
# bench_compare.sh: run the transfer bandwidth benchmarks in interleaved
# rounds and print the ratio table of transfer/BENCHMARKS.md.
#
#   transfer/testdata/bench_compare.sh [rounds] [benchtime]
#
# Each round runs, back to back: the purego NIXL binding (BenchmarkWrite in
# transfer/nixl) with the loopback baseline, NIXL's own Python API
# (transfer/nixl/testdata/bench_nixl_py.py) from the same wheel, and the TCP
# backend (BenchmarkWrite in transfer/tcp) with the loopback baseline.
# Interleaving spreads the noise of a shared machine over all of them; the
# table reports medians over the rounds. Raw output goes to $OUT (default
# .tmp/bench).
#
# Needs scripts/install-nixl.sh to have run (it is run here if needed).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
rounds="${1:-5}"
benchtime="${2:-1s}"
out="${OUT:-$root/.tmp/bench}"
mkdir -p "$out"

export PDPLANE_NIXL_LIB="${PDPLANE_NIXL_LIB:-$(scripts/install-nixl.sh | tail -1)}"
export UCX_TLS="${UCX_TLS:-tcp}" UCX_NET_DEVICES="${UCX_NET_DEVICES:-lo}"
venv_python="${PYTHON:-$root/.venv/bin/python}"

go test -c -o "$out/nixl.test" ./transfer/nixl/
go test -c -o "$out/tcp.test" ./transfer/tcp/

: >"$out/raw.txt"
for i in $(seq 1 "$rounds"); do
	echo "round $i/$rounds" >&2
	"$out/nixl.test" -test.run '^$' -test.bench 'Write|LoopbackTCP' -test.benchtime "$benchtime" 2>/dev/null |
		grep '^Benchmark' | sed 's/^Benchmark/nixl:Benchmark/' >>"$out/raw.txt"
	"$venv_python" transfer/nixl/testdata/bench_nixl_py.py --min-time "${benchtime%s}" 2>/dev/null |
		grep '^Benchmark' | sed 's/^Benchmark/py:Benchmark/' >>"$out/raw.txt"
	"$out/tcp.test" -test.run '^$' -test.bench 'Write|LoopbackTCP' -test.benchtime "$benchtime" 2>/dev/null |
		grep '^Benchmark' | sed 's/^Benchmark/tcp:Benchmark/' >>"$out/raw.txt"
done

python3 - "$out/raw.txt" <<'EOF'
import re, statistics, sys
from collections import defaultdict

mbs = defaultdict(list)
for line in open(sys.argv[1]):
    m = re.match(r"(\w+):Benchmark(\w+)/(\w+?)(?:-\d+)?\s+\d+\s+[\d.]+ ns/op\s+([\d.]+) MB/s", line)
    if m:
        pkg, name, size, v = m.groups()
        mbs[(pkg, name, size)].append(float(v))

nan = float("nan")
def med(*keys):
    v = [x for k in keys for x in mbs.get(k, [])]
    return statistics.median(v) if v else nan
def best(*keys):
    v = [x for k in keys for x in mbs.get(k, [])]
    return max(v) if v else nan

sizes = ["4KiB", "64KiB", "1MiB", "16MiB", "64MiB"]
n = max((len(v) for v in mbs.values()), default=0)
print(f"{n} rounds; MB/s (1 MB = 10^6 bytes); median over the rounds, best round in brackets.\n")
print("| size | NIXL, purego binding | NIXL, Python API | binding / Python | TCP backend | loopback net.Conn | TCP / loopback |")
print("|---:|---:|---:|---:|---:|---:|---:|")
for s in sizes:
    g, p = ("nixl", "Write", s), ("py", "PythonWrite", s)
    t, l = ("tcp", "Write", s), [("tcp", "LoopbackTCP", s), ("nixl", "LoopbackTCP", s)]
    print(f"| {s} | {med(g):.0f} ({best(g):.0f}) | {med(p):.0f} ({best(p):.0f}) | {med(g) / med(p):.0%} ({best(g) / best(p):.0%})"
          f" | {med(t):.0f} ({best(t):.0f}) | {med(*l):.0f} ({best(*l):.0f}) | {med(t) / med(*l):.0%} ({best(t) / best(*l):.0%}) |")
EOF
