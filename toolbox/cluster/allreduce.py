"""The all-reduce check `cluster check` runs on every node (`python3 -c` of this file's source,
so it needs only torch on the node, which the image and a training venv have).

Every rank fills a buffer with rank+1; the sum must be n(n+1)/2 everywhere. Rank 0 prints one
`ALLREDUCE {json}` line with the result, the latency of an 8-byte all-reduce and the bandwidth
of a large one (bus bandwidth as nccl-tests defines it: algbw * 2(n-1)/n).
"""

import argparse
import datetime
import json
import os
import statistics
import sys
import time


def main(argv=None):
    ap = argparse.ArgumentParser(prog="allreduce-check")
    ap.add_argument("--nnodes", type=int, required=True)
    ap.add_argument("--node-rank", type=int, required=True)
    ap.add_argument("--master-addr", required=True)
    ap.add_argument("--master-port", type=int, required=True)
    ap.add_argument("--cpu", action="store_true")
    ap.add_argument("--size-mib", type=float, default=16.0)
    ap.add_argument("--iters", type=int, default=10)
    a = ap.parse_args(argv)

    import torch
    import torch.distributed as dist

    gpu = not a.cpu and torch.cuda.is_available()
    backend = "nccl" if gpu else "gloo"  # nccl is RCCL on ROCm builds of torch
    device = torch.device("cuda", 0) if gpu else torch.device("cpu")
    dist.init_process_group(backend, init_method=f"tcp://{a.master_addr}:{a.master_port}",
                            rank=a.node_rank, world_size=a.nnodes, timeout=datetime.timedelta(seconds=120))
    n, rank = a.nnodes, a.node_rank

    def sync():
        if gpu:
            torch.cuda.synchronize()

    def timed(t, iters):
        times = []
        for _ in range(iters):
            dist.barrier()
            sync()
            t0 = time.perf_counter()
            dist.all_reduce(t)
            sync()
            times.append(time.perf_counter() - t0)
        return times

    numel = max(1, int(a.size_mib * 2**20) // 4)
    buf = torch.full((numel,), float(rank + 1), dtype=torch.float32, device=device)
    dist.all_reduce(buf)
    expected = n * (n + 1) / 2
    ok = bool(torch.all(buf == expected).item())
    got = float(buf[0].item())
    small = torch.ones(2, dtype=torch.float32, device=device)
    timed(small, 3)  # warm-up
    lat = statistics.median(timed(small, max(5, a.iters * 2)))
    big_t = statistics.median(timed(buf, a.iters))
    algbw = numel * 4 / big_t / 1e9
    result = {
        "ok": ok, "sum": got, "expected": expected, "world_size": n, "dist_backend": backend,
        "bytes": numel * 4, "latency_us": round(lat * 1e6, 1), "time_ms": round(big_t * 1e3, 3),
        "algbw_gbps": round(algbw, 3), "busbw_gbps": round(algbw * 2 * (n - 1) / n, 3),
        "ifname": os.environ.get("GLOO_SOCKET_IFNAME" if backend == "gloo" else "NCCL_SOCKET_IFNAME"),
    }
    # Each rank reports its own view of correctness; rank 0 the timings too.
    oks = torch.tensor([1.0 if ok else 0.0], device=device)
    dist.all_reduce(oks)
    result["ranks_ok"] = int(oks.item())
    if rank == 0:
        print("ALLREDUCE " + json.dumps(result), flush=True)
    else:
        print(f"rank {rank}: sum {got} ({'ok' if ok else 'WRONG'})", flush=True)
    dist.destroy_process_group()
    return 0 if ok and result["ranks_ok"] == n else 1


if __name__ == "__main__":
    sys.exit(main())
