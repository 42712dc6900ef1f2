#!/usr/bin/env python3
"""DRAM to DRAM WRITE bandwidth through NIXL's own Python API.

The counterpart of `go test -bench BenchmarkWrite ./transfer/nixl/`: two
agents in one process, one UCX backend each (engine_config TLS=tcp, as the Go
benchmark creates it; thread sync STRICT; the source without a progress
thread, the destination with the default one), page-aligned host buffers, and per op exactly what the
Go binding does per op: build the descriptor lists, create the request, post
it, poll until done, release it.

Run it with the interpreter of the venv scripts/install-nixl.sh made, with the
same UCX environment as the Go benchmark:

    UCX_TLS=tcp UCX_NET_DEVICES=lo .venv/bin/python \
        transfer/nixl/testdata/bench_nixl_py.py [--min-time 1.0]

It prints one line per size, in the format of `go test -bench`, so both can be
read by the same tooling.
"""

import argparse
import mmap
import os
import sys
import time

os.environ.setdefault("UCX_TLS", "tcp")
os.environ.setdefault("UCX_NET_DEVICES", "lo")
os.environ.setdefault("UCX_ERROR_SIGNALS", "")

import numpy as np  # noqa: E402

try:
    from nixl._api import nixl_agent, nixl_agent_config, nixl_thread_sync_t  # noqa: E402
except ImportError:
    from nixl_cu12._api import nixl_agent, nixl_agent_config, nixl_thread_sync_t  # noqa: E402

SIZES = [4 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20]


def size_name(n):
    return f"{n >> 20}MiB" if n >= 1 << 20 else f"{n >> 10}KiB"


def host_buffer(n):
    """Page-aligned anonymous memory, as the Go side maps it."""
    m = mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    a = np.frombuffer(m, dtype=np.uint8)
    a[::4096] = 0  # touch every page once
    return m, a


def make_agent(name, progress_thread):
    # Thread sync STRICT, as the Go binding (and SGLang) create agents.
    cfg = nixl_agent_config(
        enable_prog_thread=progress_thread,
        backends=[],
        sync_mode=nixl_thread_sync_t.NIXL_THREAD_SYNC_STRICT,
    )
    agent = nixl_agent(name, cfg)
    agent.create_backend("UCX", {"engine_config": "TLS=tcp"})
    return agent


def bench(size, min_time):
    # As in the Go benchmark: the source polls (and so progresses) its own
    # transfers, the destination has NIXL's default busy progress thread.
    src = make_agent(f"py-src-{size}", False)
    dst = make_agent(f"py-dst-{size}", True)
    sm, sa = host_buffer(size)
    dm, da = host_buffer(size)
    sa[:] = np.arange(size, dtype=np.uint64).astype(np.uint8)
    saddr, daddr = sa.ctypes.data, da.ctypes.data
    sreg = src.register_memory([(saddr, size, 0, "")], "DRAM")
    dreg = dst.register_memory([(daddr, size, 0, "")], "DRAM")
    remote = src.add_remote_agent(dst.get_agent_metadata())

    def op():
        local = src.get_xfer_descs([(saddr, size, 0)], "DRAM")
        far = src.get_xfer_descs([(daddr, size, 0)], "DRAM")
        h = src.initialize_xfer("WRITE", local, far, remote)
        state = src.transfer(h)
        while state == "PROC":
            state = src.check_xfer_state(h)
        if state != "DONE":
            raise RuntimeError(f"transfer state {state}")
        src.release_xfer_handle(h)

    op()  # warm up the connection
    if not np.array_equal(sa, da):
        raise RuntimeError("bytes differ after the warm-up WRITE")
    # Grow the iteration count like `go test -bench` until min_time is met.
    n = 1
    while True:
        t0 = time.perf_counter()
        for _ in range(n):
            op()
        dt = time.perf_counter() - t0
        if dt >= min_time or n >= 1 << 24:
            break
        n = max(n + 1, min(100 * n, int(n * 1.2 * min_time / max(dt, 1e-9))))
    src.remove_remote_agent(remote)
    src.deregister_memory(sreg)
    dst.deregister_memory(dreg)
    del sa, da
    sm.close()
    dm.close()
    return n, dt


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--min-time", type=float, default=1.0, help="seconds per size (like -benchtime)")
    ap.add_argument("--sizes", default=",".join(size_name(s) for s in SIZES), help="comma-separated subset of sizes")
    args = ap.parse_args()
    wanted = set(args.sizes.split(","))
    print(f"goos: {sys.platform}\npkg: nixl python api (nixl_cu12 {nixl_version()})", flush=True)
    for size in SIZES:
        if size_name(size) not in wanted:
            continue
        n, dt = bench(size, args.min_time)
        ns = dt / n * 1e9
        mbs = size * n / dt / 1e6
        print(f"BenchmarkPythonWrite/{size_name(size)}\t{n:10d}\t{ns:14.0f} ns/op\t{mbs:10.2f} MB/s", flush=True)


def nixl_version():
    try:
        from importlib.metadata import version

        return version("nixl-cu12")
    except Exception:  # noqa: BLE001
        return "unknown"


if __name__ == "__main__":
    main()
