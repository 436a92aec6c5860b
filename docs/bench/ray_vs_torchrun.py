"""docs/ray.md's measurement: both engines on the same 2-node CPU run (the netns hosts of
tests/cluster, gloo, one worker per node, tiny model): start-up, steps/s, and recovery after node 2
is killed (every process of its namespace) once checkpoint-50 exists. As root, from the checkout:
    .venv/bin/python docs/bench/ray_vs_torchrun.py [CHECKOUT]    (prints the JSON docs/ray.md quotes)
"""
import json, os, subprocess, sys, tempfile, time
from pathlib import Path
ROOT = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parents[2]); sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests/cluster"), str(ROOT / "entrypoints")]
import netns_harness as nh
from helpers.tiny import make_tiny_model, write_dataset, write_train_config
os.environ.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
W = Path(tempfile.mkdtemp(prefix="ray-vs-torchrun-"))
PY, VBIN = sys.executable, str(Path(sys.executable).parent)
model = make_tiny_model(W / "model"); data = write_dataset(W / "d.jsonl", "text", n=64)
STEPS = int(os.environ.get("STEPS", "200"))
def cfg(name):
    return write_train_config(W / f"{name}.yaml", model, data, W / name, **{"train.max_steps": STEPS,
        "train.per_device_batch_size": 2, "train.batch_size": 8, "output.save_steps": 50})
hosts = nh.start(W / "h", tag="m1")
a, b = hosts.nodes
env = {**os.environ, "PYTHONPATH": str(ROOT / "entrypoints"), "TOOLBOX_STATE_DIR": str(W / "state")}
RD = "/tmp/tbmeas-{node_rank}"
def ray_cli(action):
    return subprocess.run(nh.netns_argv(a, [PY, "-m", "toolbox", "cluster", "ray", action, "-F", str(hosts.ssh_config),
        "--hosts", "node1,node2", "--engine", "none", "--remote-path", VBIN, "--cpu", "--env", "PYTHONPATH",
        "--env", "OMP_NUM_THREADS", "--env", "HF_HUB_OFFLINE", "--ray-dir", RD]), cwd=ROOT, env=env, capture_output=True, text=True)
def torchrun(c, *extra):
    return [subprocess.Popen(nh.netns_argv(n, [PY, "-m", "toolbox_train.commands.launch", "--strategy", "ddp", "--cpu",
        "--nproc", "1", "--nnodes", "2", "--node-rank", str(i), "--master-addr", a.addr, "--master-port", "29533",
        "--", "finetune", "--config", str(c), *extra]), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for i, n in enumerate((a, b))]
def ray_launch(c, *extra):
    return subprocess.Popen(nh.netns_argv(a, [PY, "-m", "toolbox_train.commands.launch", "--launcher", "ray", "--address",
        f"{a.addr}:6379", "--nodes", "2", "--cpu", "--strategy", "ddp", "--max-restarts", "2", "--", "finetune", "--config",
        str(c), *extra]), env={**env, "RAY_AUTH_TOKEN_PATH": "/tmp/tbmeas-0/auth_token"},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
def kill_node(n):
    keep = set(nh.sshd_pids(n))
    for pid in nh.sh("ip", "netns", "pids", n.netns, check=False).stdout.split():
        if int(pid) not in keep:
            try: os.kill(int(pid), 9)
            except ProcessLookupError: pass
def summary(out): return json.loads((W / out / "summary.json").read_text())
res = {}
try:
    t = time.monotonic(); r = ray_cli("up"); res["ray_up_s"] = round(time.monotonic() - t, 1); assert r.returncode == 0, r.stdout + r.stderr
    # uninterrupted runs
    for name in ("tr", "ray"):
        c = cfg(name); t = time.monotonic()
        ps = torchrun(c) if name == "tr" else [ray_launch(c)]
        outs = [p.communicate() for p in ps]; wall = time.monotonic() - t
        assert all(p.returncode == 0 for p in ps), outs[0][1][-3000:]
        s = summary(name)
        res[name] = {"wall_s": round(wall, 1), "train_s": s["wall_s"], "steps_per_s": round(s["steps"] / s["wall_s"], 2),
                     "startup_s": round(wall - s["wall_s"], 1)}
    from safetensors.torch import load_file
    wa, wb = load_file(str(W / "tr/model.safetensors")), load_file(str(W / "ray/model.safetensors"))
    res["max_abs_diff"] = max(float((wa[k] - wb[k]).abs().max()) for k in wa)
    # recovery: node 2 killed once checkpoint-50 exists
    for name in ("trk", "rayk"):
        c = cfg(name); cp = W / name / "checkpoints" / "checkpoint-50"
        ps = torchrun(c) if name == "trk" else [ray_launch(c)]
        while not cp.is_dir(): time.sleep(0.05)
        tk = time.monotonic(); kill_node(b)
        if name == "trk":
            for p in ps: p.communicate()
            t_exit = time.monotonic()
            ps = torchrun(c, "--resume"); outs = [p.communicate() for p in ps]  # rerun at once, by hand
            t_end = time.monotonic(); err = outs[0][1]
            res[name] = {"kill_to_launch_exit_s": round(t_exit - tk, 1), "kill_to_end_s": round(t_end - tk, 1)}
            r = ray_cli("up")  # the killed node's Ray back, for the Ray case
        else:
            r = ray_cli("up"); t_up = time.monotonic()
            so, se = ps[0].communicate(); t_end = time.monotonic(); err = se
            assert ps[0].returncode == 0, se[-3000:]
            res[name] = {"kill_to_node_back_s": round(t_up - tk, 1), "kill_to_end_s": round(t_end - tk, 1)}
        assert "resuming from" in err, err[-2000:]
        s = summary(name); res[name]["resumed_train_s"] = s["wall_s"]
        wk = load_file(str(W / name / "model.safetensors")); res[name]["max_abs_diff_vs_uninterrupted"] = max(float((wa[k] - wk[k]).abs().max()) for k in wa)
finally:
    ray_cli("down"); nh.stop(hosts)
    for i in (0, 1): subprocess.run(["rm", "-rf", f"/tmp/tbmeas-{i}"])
    subprocess.run(["rm", "-rf", str(W)])
print(json.dumps(res, indent=1))
