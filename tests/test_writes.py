"""Every product write that must not be half-done goes through the one durable atomic write
(toolbox_train.disk.atomic_write; toolbox.files.atomic_write on the host) (issue 39). An AST scan
of toolbox/ and entrypoints/toolbox_train/ finds every other way to write a file; the few that
need not be atomic are listed below, each with its reason, and a new one fails."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = (ROOT / "toolbox", ROOT / "entrypoints" / "toolbox_train")

_TEMP = "a file in a temporary folder or file that is removed after"
_WHOLE = "inside a temporary folder that is renamed into place whole"
_LOG = "a log stream, appended to as the process runs"
_LIB = ("a model saved by the library (many files): into a temp folder renamed whole, or the final "
        "model, whose partial files save_final removes on a failure")

# (file under the repository, enclosing function, the write call): why it need not be atomic.
ALLOWED = {
    ("toolbox/cli.py", "main", "os.open"): "/dev/null onto stdout, not a file",
    ("entrypoints/toolbox_train/contract.py", "_quiet_stdout", "os.open"): "/dev/null onto stdout, not a file",
    ("entrypoints/toolbox_train/disk.py", "_write_stream", "os.open"): "the atomic write's own device/FIFO path",
    ("entrypoints/toolbox_train/disk.py", "atomic_write", "tempfile.mkstemp"): "the atomic write itself",
    ("entrypoints/toolbox_train/disk.py", "atomic_write", "os.fdopen"): "the atomic write itself",
    ("entrypoints/toolbox_train/disk.py", "_write_stream", "os.fdopen"): "the atomic write's own device/FIFO path",
    ("entrypoints/toolbox_train/bench/report.py", "render_chart", "savefig"): "into memory, then atomic_write",
    ("entrypoints/toolbox_train/sandbox/jail.py", "_run", "open"): "an anonymous memfd (the sandbox's job on its "
                                                                  "stdin), no file on disk",
    ("entrypoints/toolbox_train/commands/finetune_report.py", "loss_plot", "savefig"): "into memory, then atomic_write",
    ("toolbox/rccl/patches.py", "verify", "shutil.move"): "a git worktree kept on request (--keep), moved whole",
    ("toolbox/rendering.py", "_copy", "shutil.copy2"): _WHOLE + " (the build context)",
    ("toolbox/rendering.py", "_copytree", "shutil.copytree"): _WHOLE + " (the build context)",
    ("toolbox/rendering.py", "_place", "write_text"): _WHOLE + " (the build context)",
    ("toolbox/rendering.py", "_place", "shutil.copy2"): _WHOLE + " (the build context)",
    ("toolbox/rendering.py", "write_context", "write_text"): _WHOLE + " (the build context)",
    ("toolbox/commands/build.py", "_fill_wheelhouse", "shutil.copy2"): "the build's temporary context folder",
    ("toolbox/commands/lint.py", "lint_text", "write_text"): _TEMP,
    ("toolbox/engines/docker.py", "_build_api", "tarfile.open"): _TEMP + " (the context sent to Docker)",
    ("toolbox/stack/python_lock.py", "compile_lock", "write_text"): _TEMP,
    ("toolbox/stack/bumping.py", "_write_checked", "write_text"): _TEMP + " (the stack checked before atomic_write)",
    ("toolbox/stack/pinning.py", "download", "tempfile.mkstemp"): (
        "a download streamed to .part-, renamed only when its sha256 is the pin: a torn file fails the check"),
    ("toolbox/stack/pinning.py", "download", "os.fdopen"): "the same download",
    ("entrypoints/toolbox_train/training/trainer.py", "on_log", "open"): _LOG + " (metrics.jsonl)",
    ("entrypoints/toolbox_train/export/llamacpp.py", "_open_log", "open"): _LOG + " (llama.cpp's output)",
    ("entrypoints/toolbox_train/export/llamacpp.py", "_open_log", "tempfile.mkstemp"): _LOG + " (llama.cpp's output)",
    ("entrypoints/toolbox_train/export/llamacpp.py", "_open_log", "os.fdopen"): _LOG + " (llama.cpp's output)",
    ("entrypoints/toolbox_train/bench/calibration.py", "run_memory", "open"): _LOG + " (a row's output)",
    ("entrypoints/toolbox_train/export/model.py", "do_gguf", "write_text"): _WHOLE + " (the export)",
    ("entrypoints/toolbox_train/export/model.py", "_execute", "write_text"): _WHOLE + " (the export)",
    ("entrypoints/toolbox_train/export/model.py", "merge", "save_pretrained"): _LIB,
    ("entrypoints/toolbox_train/export/evaluate.py", "run", "write_text"): _TEMP,
    ("entrypoints/toolbox_train/commands/ray_train.py", "check_nodes", "write_text"): (
        "a marker every node looks for, removed after the check"),
    ("entrypoints/toolbox_train/training/trainer.py", "_save_final", "save_model"): _LIB,
    ("entrypoints/toolbox_train/training/trainer.py", "_save_final", "save_pretrained"): _LIB,
    ("entrypoints/toolbox_train/training/trainer.py", "_save_final", "save_pretrained_merged"): _LIB,
    ("entrypoints/toolbox_train/bench/synthetic.py", "build_tokenizer", "save_pretrained"): _LIB,
    ("entrypoints/toolbox_train/bench/synthetic.py", "build_model_dir", "save_pretrained"): _LIB,
}

_ATTR_WRITES = {"write_text", "write_bytes", "savefig", "save_pretrained", "save_model", "save_pretrained_merged",
                "to_json_file", "save_to_disk", "to_csv"}
_DOTTED_WRITES = {"shutil.copy", "shutil.copy2", "shutil.copyfile", "shutil.copytree", "shutil.move",
                  "tempfile.mkstemp", "torch.save", "json.dump", "os.fdopen", "tarfile.open", "zipfile.ZipFile"}


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return ""


def _mode(call: ast.Call, position: int) -> str:
    arg = call.args[position] if len(call.args) > position else next(
        (k.value for k in call.keywords if k.arg == "mode"), None)
    return arg.value if isinstance(arg, ast.Constant) and isinstance(arg.value, str) else "r"


def _write(call: ast.Call) -> str | None:
    """The name of the write `call` is, or None for a call that writes no file."""
    name = _dotted(call.func)
    attr = call.func.attr if isinstance(call.func, ast.Attribute) else None
    if name in _DOTTED_WRITES:
        if name == "tarfile.open" and not set(_mode(call, 1)) & set("wax"):
            return None
        if name == "os.fdopen" and not set(_mode(call, 1)) & set("wax+"):
            return None
        return name
    if name == "os.open":
        flags = {n.attr for n in ast.walk(call.args[1]) if isinstance(n, ast.Attribute)} if len(call.args) > 1 else set()
        return name if flags & {"O_WRONLY", "O_RDWR", "O_CREAT"} else None
    if name in ("yaml.dump", "yaml.safe_dump") and (len(call.args) > 1 or any(k.arg == "stream" for k in call.keywords)):
        return name
    if name == "open" and set(_mode(call, 1)) & set("wax+"):
        return "open"
    if attr == "open" and name != "os.open" and set(_mode(call, 0)) & set("wax+"):
        return "open"  # Path.open("w")
    if attr in _ATTR_WRITES:
        return attr
    return None


def writes(path: Path, rel: str) -> list[tuple[tuple[str, str, str], int]]:
    """((file, enclosing function, write), line) of every write in the module at `path`."""
    found = []

    def visit(node: ast.AST, func: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else func
            if isinstance(child, ast.Call) and (w := _write(child)):
                found.append(((rel, func, w), child.lineno))
            visit(child, inner)

    visit(ast.parse(path.read_text(encoding="utf-8")), "<module>")
    return found


def unlisted(root: Path = ROOT) -> list[str]:
    out = []
    for pkg in PACKAGES:
        for py in sorted((root / pkg.relative_to(ROOT)).rglob("*.py")):
            rel = py.relative_to(root).as_posix()
            out += [f"{rel}:{line}: {key[2]} in {key[1]}()" for key, line in writes(py, rel) if key not in ALLOWED]
    return out


def test_every_product_write_goes_through_the_atomic_write():
    bad = unlisted()
    assert not bad, ("writes that bypass toolbox_train.disk.atomic_write (use it, or list the write in "
                     "tests/test_writes.py with why it need not be atomic):\n" + "\n".join(bad))


def test_the_allow_list_names_only_writes_that_exist():
    seen = {key for pkg in PACKAGES for py in pkg.rglob("*.py")
            for key, _ in writes(py, py.relative_to(ROOT).as_posix())}
    stale = sorted(set(ALLOWED) - seen)
    assert not stale, f"tests/test_writes.py allows writes that are gone: {stale}"


def test_a_new_bypass_is_found(tmp_path):
    # A check that cannot fail proves nothing: a copy of a module with the bypasses the scan must see.
    for pkg in PACKAGES:
        (tmp_path / pkg.relative_to(ROOT)).mkdir(parents=True)
    mod = tmp_path / "entrypoints" / "toolbox_train" / "new.py"
    mod.write_text(
        "import json, os, shutil, yaml\nfrom pathlib import Path\n"
        "def save(p: Path, obj):\n"
        "    p.write_text(json.dumps(obj))\n"
        "    with open(p, 'w') as f:\n        json.dump(obj, f)\n"
        "    with p.open('a') as f:\n        yaml.safe_dump(obj, f)\n"
        "    shutil.copy(p, p.with_suffix('.bak'))\n"
        "    os.open(p, os.O_WRONLY | os.O_CREAT)\n"
        "def fine(p: Path):\n"
        "    p.read_text(); open(p).read(); p.open().read(); yaml.safe_dump({}); os.open(p, os.O_RDONLY)\n")
    bad = unlisted(tmp_path)
    assert [b.split(": ", 1)[1] for b in bad] == [
        "write_text in save()", "open in save()", "json.dump in save()", "open in save()", "yaml.safe_dump in save()",
        "shutil.copy in save()", "os.open in save()"], bad


def test_the_ray_cluster_token_is_written_whole_and_kept_0600(tmp_path, monkeypatch):
    from toolbox.cluster import ray_nodes

    monkeypatch.setenv("TOOLBOX_STATE_DIR", str(tmp_path))
    token = ray_nodes.cluster_token()
    path = tmp_path / "ray" / "auth_token"
    assert path.read_text() == token and len(token) == 64 and (path.stat().st_mode & 0o777) == 0o600
    assert ray_nodes.cluster_token() == token and sorted(p.name for p in path.parent.iterdir()) == ["auth_token"]
