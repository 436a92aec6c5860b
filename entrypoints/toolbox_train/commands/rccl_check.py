"""`rccl-check`: are the collectives right, and how fast are they?

all_reduce, all_gather and reduce_scatter over torch.distributed for a range of sizes,
each checked element by element against the exact expected result, then timed; a table
with algorithm and bus bandwidth (the nccl-tests definitions) per op and size. Runs with
NCCL/RCCL on GPUs and with gloo on the CPU. Afterwards runs `all_reduce_perf` from
rccl-tests/nccl-tests when it is installed (PATH or /opt/rccl/bin).

    rccl-check                      # every local GPU (or 2 CPU processes), all ops
    rccl-check --cpu --nproc 2      # gloo on the CPU
    torchrun --nproc-per-node 2 -m toolbox_train.commands.rccl_check   # under torchrun: any nodes

Exit 0 when every result is correct, 1 when one is not (or a rank failed), 2 for bad input.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

from toolbox_train import sizes
from toolbox_train.contract import UserError, command_parser, new_names, renamed, run_command
from toolbox_train.disk import atomic_write

OPS = ("all_reduce", "all_gather", "reduce_scatter")
# nccl-tests' PERFORMANCE.md: busbw = algbw * factor, which makes the numbers comparable to
# link bandwidth whatever the rank count.
BUS_FACTOR = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
}
DTYPES = ("float32", "float16", "bfloat16", "float64", "int32")
RCCL_TESTS_DIRS = ("/opt/rccl/bin",)


class CheckError(UserError):
    """Bad arguments (exit 2)."""


def parse_size(text: str) -> int:
    """A size as rccl-tests read one: K/M/G (KB, KiB, ...) binary."""
    try:
        value = sizes.parse_size(text, decimal=False)
    except ValueError:
        raise CheckError(f"size {text!r}: expected a number with an optional K/M/G suffix, e.g. 64K") from None
    if value <= 0:
        raise CheckError(f"size {text!r} must be positive")
    return value


def human(n: float) -> str:
    return sizes.human_size(n).replace(".0 ", " ")


def size_list(args) -> list[int]:
    if args.sizes:
        return sorted({parse_size(s) for s in args.sizes.split(",") if s.strip()})
    lo, hi = parse_size(args.min_bytes), parse_size(args.max_bytes)
    if lo > hi:
        raise CheckError(f"--min-bytes {args.min_bytes} is larger than --max-bytes {args.max_bytes}")
    if args.step_factor < 2:
        raise CheckError("--step-factor must be at least 2")
    out, s = [], lo
    while s <= hi:
        out.append(s)
        s *= args.step_factor
    return out


def build_parser() -> argparse.ArgumentParser:
    p = command_parser("rccl-check", __doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--nproc", type=int, default=None,
                   help="local processes to start (default: one per GPU, or 2 on the CPU); "
                        "ignored under torchrun")
    p.add_argument("--dist-backend", choices=("auto", "nccl", "gloo"), default="auto",
                   help="torch.distributed's backend; auto: nccl (RCCL on ROCm) when GPUs are visible, else gloo")
    renamed(p, "--backend", "--dist-backend")  # `backend` is finetune's HF/Unsloth
    p.add_argument("--cpu", action="store_true", help="force CPU tensors and gloo")
    p.add_argument("--ops", default=",".join(OPS), help=f"comma list from {','.join(OPS)}")
    p.add_argument("--sizes", default=None, help="explicit comma list of sizes, e.g. 4K,1M,64M")
    p.add_argument("--min-bytes", default=None, help="smallest size (default 4K on CPU, 8K on GPU)")
    p.add_argument("--max-bytes", default=None, help="largest size (default 4M on CPU, 256M on GPU)")
    p.add_argument("--step-factor", type=int, default=4, help="multiply the size by this each step")
    p.add_argument("--dtype", choices=DTYPES, default="float32")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--json", metavar="FILE", default=None, help="also write the results here (atomically)")
    p.add_argument("--all-reduce-perf", choices=("auto", "on", "off"), default="auto",
                   help="run rccl-tests' all_reduce_perf afterwards: auto = when installed and on GPUs")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds before the local ranks are stopped")
    return p


# ---------------------------------------------------------------- worker (one rank)

def _pattern(torch, n: int, rank: int, dtype, device):
    # Small integers: exact in every dtype for sums over up to 32 ranks, and different per rank
    # and per position, so a misplaced or half-reduced chunk is caught.
    i = torch.arange(n, device=device, dtype=torch.int64)
    return ((i * 7 + rank * 3) % 17 - 8).to(dtype)


def _expected_sum(torch, n: int, world: int, dtype, device):
    acc = torch.zeros(n, device=device, dtype=torch.int64)
    for r in range(world):
        acc += _pattern(torch, n, r, torch.int64, device)
    return acc.to(dtype)


def _collectives(dist):
    ag = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    rs = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    return ag, rs


def run_rank(args) -> int:
    import torch
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    on_gpu = not args.cpu and torch.cuda.is_available()
    backend = args.dist_backend if args.dist_backend != "auto" else ("nccl" if on_gpu else "gloo")
    if backend == "nccl" and not on_gpu:
        raise CheckError("--dist-backend nccl needs a visible GPU (drop --cpu, or use gloo)")
    if on_gpu and backend == "nccl":
        torch.cuda.set_device(local_rank % torch.cuda.device_count())
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        device = torch.device("cpu")
    dist.init_process_group(backend=backend, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=args.timeout))
    dtype = getattr(torch, args.dtype)
    elt = torch.tensor([], dtype=dtype).element_size()
    all_gather, reduce_scatter = _collectives(dist)

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    results = []
    try:
        for op in args.op_list:
            for size in args.size_list:
                count = max(world, size // elt // world * world)  # divisible by the rank count
                nbytes = count * elt
                if op == "all_reduce":
                    buf = _pattern(torch, count, rank, dtype, device)
                    want = _expected_sum(torch, count, world, dtype, device)
                    def call(b=buf): dist.all_reduce(b)  # noqa: E704
                    got = buf
                elif op == "all_gather":
                    per = count // world
                    src = _pattern(torch, per, rank, dtype, device)
                    got = torch.empty(count, dtype=dtype, device=device)
                    want = torch.cat([_pattern(torch, per, r, dtype, device) for r in range(world)])
                    def call(o=got, s=src): all_gather(o, s)  # noqa: E704
                else:
                    per = count // world
                    src = _pattern(torch, count, rank, dtype, device)
                    got = torch.empty(per, dtype=dtype, device=device)
                    want = _expected_sum(torch, count, world, dtype, device)[rank * per:(rank + 1) * per]
                    def call(o=got, s=src): reduce_scatter(o, s)  # noqa: E704
                call()
                sync()
                wrong = torch.tensor([int((got != want).sum().item())], dtype=torch.int64, device=device)
                for _ in range(args.warmup):
                    call()
                sync()
                dist.barrier()
                t0 = time.perf_counter()
                for _ in range(args.iters):
                    call()
                sync()
                elapsed = torch.tensor([(time.perf_counter() - t0) / args.iters], dtype=torch.float64, device=device)
                dist.all_reduce(wrong)  # every rank's errors count
                dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # the slowest rank is the op's time
                t = float(elapsed.item())
                algbw = nbytes / t / 1e9 if t > 0 else 0.0
                results.append({"op": op, "bytes": nbytes, "count": count, "dtype": args.dtype,
                                "time_us": t * 1e6, "algbw_gbs": algbw,
                                "busbw_gbs": algbw * BUS_FACTOR[op](world),
                                "wrong": int(wrong.item()), "ok": int(wrong.item()) == 0})
    finally:
        dist.destroy_process_group()

    if rank == 0:
        header = {"dist_backend": backend, "world_size": world, "device": _device_name(torch, device),
                  "torch": torch.__version__, "nccl": _nccl_version(torch) if backend == "nccl" else None}
        print(format_table(header, results), flush=True)
        if args.json:
            atomic_write(Path(args.json), json.dumps({"header": header, "results": results}, indent=2) + "\n")
    return 0 if all(r["ok"] for r in results) else 1


def _device_name(torch, device) -> str:
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        arch = getattr(props, "gcnArchName", "")
        return f"{props.name}{' (' + arch + ')' if arch else ''}"
    return "cpu"


def _nccl_version(torch) -> str | None:
    try:
        v = torch.cuda.nccl.version()
        return ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
    except Exception:  # noqa: BLE001 (informational only)
        return None


def format_table(header: dict, results: list[dict]) -> str:
    lines = [f"rccl-check: dist-backend={header['dist_backend']} world_size={header['world_size']} "
             f"device={header['device']} torch={header['torch']}"
             + (f" nccl/rccl={header['nccl']}" if header.get("nccl") else "")]
    lines.append(f"{'op':<15}{'size':>10}{'count':>12}{'dtype':>10}{'time_us':>12}"
                 f"{'algbw_GB/s':>12}{'busbw_GB/s':>12}  check")
    for r in results:
        check = "ok" if r["ok"] else f"WRONG ({r['wrong']} elements)"
        lines.append(f"{r['op']:<15}{human(r['bytes']):>10}{r['count']:>12}{r['dtype']:>10}"
                     f"{r['time_us']:>12.1f}{r['algbw_gbs']:>12.3f}{r['busbw_gbs']:>12.3f}  {check}")
    bad = sum(not r["ok"] for r in results)
    lines.append(f"rccl-check: {len(results) - bad} passed, {bad} failed" if bad else
                 f"rccl-check: all {len(results)} results correct")
    return "\n".join(lines)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn_local(args, argv: list[str]) -> int:
    """Start args.nproc ranks on this host, like torchrun would, and wait for all of them."""
    env = dict(os.environ)
    pkg_parent = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = pkg_parent + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), WORLD_SIZE=str(args.nproc),
               LOCAL_WORLD_SIZE=str(args.nproc), GLOO_SOCKET_IFNAME=env.get("GLOO_SOCKET_IFNAME", "lo"))
    procs = []
    for r in range(args.nproc):
        procs.append(subprocess.Popen([sys.executable, "-m", "toolbox_train.commands.rccl_check", *argv],
                                      env={**env, "RANK": str(r), "LOCAL_RANK": str(r)}))
    deadline = time.monotonic() + args.timeout
    codes: dict[int, int] = {}
    try:
        while len(codes) < len(procs):
            for i, p in enumerate(procs):
                if i not in codes and p.poll() is not None:
                    codes[i] = p.returncode
                    if p.returncode != 0:  # one rank down: the others would hang in a collective
                        deadline = min(deadline, time.monotonic() + 10)
            if time.monotonic() > deadline:
                print(f"rccl-check: stopping ranks still running after the deadline "
                      f"(--timeout {args.timeout:g}s, or 10 s after a rank failed)", file=sys.stderr)
                break
            time.sleep(0.05)
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
    rcs = [p.returncode for p in procs]
    if any(rc not in (0, 1) for rc in rcs):
        print(f"rccl-check: rank exit codes {rcs}", file=sys.stderr)
        return 1
    return max(rcs)


# ---------------------------------------------------------------- rccl-tests

def find_all_reduce_perf() -> str | None:
    found = shutil.which("all_reduce_perf")
    if found:
        return found
    for d in RCCL_TESTS_DIRS:
        cand = Path(d) / "all_reduce_perf"
        if cand.is_file() and os.access(cand, os.X_OK):
            return str(cand)
    return None


def run_all_reduce_perf(binary: str, ngpus: int, min_bytes: int, max_bytes: int, timeout: float) -> int:
    cmd = [binary, "-b", str(min_bytes), "-e", str(max_bytes), "-f", "2", "-g", str(max(1, ngpus)), "-c", "1"]
    print(f"rccl-check: running {' '.join(cmd)}", flush=True)
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        print(f"rccl-check: all_reduce_perf timed out after {timeout:g}s", file=sys.stderr)
        return 1
    sys.stdout.write(res.stdout)
    sys.stderr.write(res.stderr)
    summary = parse_nccl_tests(res.stdout)
    problems = []
    if res.returncode != 0:
        problems.append(f"exit code {res.returncode}")
    if summary["out_of_bounds"] is None:
        problems.append("no 'Out of bounds values' line in its output")
    elif summary["out_of_bounds"] != 0:
        problems.append(f"{summary['out_of_bounds']} out-of-bounds values")
    if summary["wrong"]:
        problems.append(f"#wrong column non-zero at {summary['wrong']} size(s)")
    if problems:
        print(f"rccl-check: all_reduce_perf FAILED: {'; '.join(problems)}", file=sys.stderr)
        return 1
    print(f"rccl-check: all_reduce_perf ok, {summary['rows']} sizes, avg bus bandwidth "
          f"{summary['avg_busbw']} GB/s")
    return 0


def parse_nccl_tests(out: str) -> dict:
    """The summary nccl-tests/rccl-tests print: per-size rows, out-of-bounds count, avg busbw."""
    oob = re.search(r"#\s*Out of bounds values\s*:\s*(\d+)", out)
    avg = re.search(r"#\s*Avg bus bandwidth\s*:\s*([0-9.]+)", out)
    rows = wrong = 0
    for line in out.splitlines():
        cols = line.split()
        if not cols or line.lstrip().startswith("#") or not cols[0].isdigit():
            continue
        rows += 1
        # size count type redop root | time algbw busbw #wrong (out-of-place) | same in-place
        if len(cols) >= 13 and (cols[8] not in ("0", "N/A") or cols[12] not in ("0", "N/A")):
            wrong += 1
    return {"out_of_bounds": int(oob.group(1)) if oob else None,
            "avg_busbw": float(avg.group(1)) if avg else None, "rows": rows, "wrong": wrong}


# ---------------------------------------------------------------- main

def main(argv: list[str] | None = None) -> int:
    return run_command("rccl-check", _run, argv)


def _run(argv: list[str]) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.op_list = [o.strip() for o in args.ops.split(",") if o.strip()]
    unknown = [o for o in args.op_list if o not in OPS]
    if unknown or not args.op_list:
        raise CheckError(f"--ops: unknown {', '.join(unknown) or '(empty)'}; choose from {', '.join(OPS)}")
    if args.iters < 1 or args.warmup < 0:
        raise CheckError("--iters must be >= 1 and --warmup >= 0")
    under_launcher = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    gpus = 0
    if not args.cpu:
        import torch
        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if args.dist_backend == "nccl" and gpus == 0:
        raise CheckError("--dist-backend nccl needs a visible GPU (drop --cpu, or use gloo)")
    on_gpu = gpus > 0 and args.dist_backend != "gloo"
    args.min_bytes = args.min_bytes or ("8K" if on_gpu else "4K")
    args.max_bytes = args.max_bytes or ("256M" if on_gpu else "4M")
    args.size_list = size_list(args)
    if under_launcher:
        return run_rank(args)
    if args.nproc is None:
        args.nproc = gpus if on_gpu else 2
    if args.nproc < 1:
        raise CheckError("--nproc must be at least 1")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    rc = spawn_local(args, new_names(parser, argv))
    want_perf = args.all_reduce_perf == "on" or (args.all_reduce_perf == "auto" and on_gpu and not args.cpu)
    if want_perf:
        binary = find_all_reduce_perf()
        if binary is None:
            if args.all_reduce_perf == "on":
                raise CheckError("--all-reduce-perf on: all_reduce_perf is not on PATH nor in "
                                 + ", ".join(RCCL_TESTS_DIRS))
            print("rccl-check: all_reduce_perf not installed (stack build_rccl_tests: true builds it); skipped")
        else:
            rc = max(rc, run_all_reduce_perf(binary, gpus if on_gpu else 1, max(8, args.size_list[0]),
                                             args.size_list[-1], args.timeout))
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
