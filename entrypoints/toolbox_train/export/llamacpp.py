"""llama.cpp's own tools, run as separate processes: the HF -> GGUF converter, llama-quantize,
llama-perplexity and llama-completion.

The image installs them under /opt/llama.cpp (bin/ + convert_hf_to_gguf.py + conversion/ +
gguf-py/, the layout of a llama.cpp source tree); `--llama-cpp DIR` or $LLAMA_CPP_DIR point
elsewhere (the host tests build the same layout into a cache folder).
"""

from __future__ import annotations

import collections
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from toolbox_train.contract import ToolError, UserError
from toolbox_train.disk import disk_full

DEFAULT_DIR = "/opt/llama.cpp"
LOGS = "logs"  # RUN/logs/<step>.log: each tool's stdout and stderr (convert-f16.log, quantize-q8_0.log, ...)

# Types llama-quantize takes without an importance matrix (tools/quantize/quantize.cpp at the
# pinned commit); f16/bf16/f32 are what the converter writes itself. Bytes per weight are what
# the formats store (block scales included), for the disk estimate; K-quant mixes rounded up.
QUANT_BYTES = {
    "f32": 4.0, "f16": 2.0, "bf16": 2.0, "q8_0": 1.0625, "q6_k": 0.8203,
    "q5_k_m": 0.72, "q5_k_s": 0.69, "q5_0": 0.6875, "q5_1": 0.75,
    "q4_k_m": 0.62, "q4_k_s": 0.57, "q4_0": 0.5625, "q4_1": 0.625, "iq4_nl": 0.5625, "iq4_xs": 0.5313,
    "q3_k_l": 0.55, "q3_k_m": 0.50, "q3_k_s": 0.45, "q2_k": 0.40, "mxfp4_moe": 0.55,
}


def parse_quants(spec: str) -> list[str]:
    quants = [q.strip().lower() for q in spec.split(",") if q.strip()]
    if not quants:
        raise UserError("--quant: empty; e.g. --quant f16,q8_0,q4_k_m")
    for q in quants:
        if q not in QUANT_BYTES:
            raise UserError(f"--quant: unknown quant type {q!r}; one of {', '.join(QUANT_BYTES)}")
    return list(dict.fromkeys(quants))  # order kept, duplicates dropped


@dataclass
class Tools:
    root: Path
    logs: Path | None = None  # where each tool's output goes (RUN/logs); None: the temp folder

    def log(self, name: str) -> Path | None:
        return self.logs / f"{name}.log" if self.logs else None

    @property
    def converter(self) -> Path:
        return self.root / "convert_hf_to_gguf.py"

    def bin(self, name: str) -> Path:
        return self.root / "bin" / name

    def missing(self, names=("llama-quantize",)) -> list[str]:
        out = [] if self.converter.is_file() else [str(self.converter)]
        return out + [str(self.bin(n)) for n in names if not os.access(self.bin(n), os.X_OK)]

    def version(self) -> str:
        f = self.root / "VERSION"
        return f.read_text().strip() if f.is_file() else "unknown"


def find_tools(flag: str | None, need=("llama-quantize",)) -> Tools:
    root = Path(flag or os.environ.get("LLAMA_CPP_DIR") or DEFAULT_DIR)
    tools = Tools(root)
    missing = tools.missing(need)
    if missing:
        where = "--llama-cpp" if flag else ("$LLAMA_CPP_DIR" if os.environ.get("LLAMA_CPP_DIR") else "the default")
        raise UserError(f"llama.cpp tools not found under {root} ({where}): missing {', '.join(missing)}; "
                        "run inside the toolbox image or pass --llama-cpp DIR")
    return tools


def _open_log(log: Path | None, name: str):
    """The log file of a tool's output (its folder made), or where that cannot be written (no run
    folder, a read-only or full one) a new file in the temp folder."""
    if log is not None:
        try:
            log.parent.mkdir(parents=True, exist_ok=True)
            return open(log, "w", encoding="utf-8", errors="replace"), log
        except OSError:
            pass
    fd, tmp = tempfile.mkstemp(prefix=f"{name}-", suffix=".log")
    return os.fdopen(fd, "w", encoding="utf-8", errors="replace"), Path(tmp)


def _close(f) -> bool:
    try:
        f.close()  # flushes: may meet the full disk too
        return True
    except OSError:
        return False


def _drop(log: Path) -> None:
    """A log cut short by a full disk goes, and its folder if that is left empty."""
    for remove in (log.unlink, log.parent.rmdir):
        try:
            remove()
        except OSError:
            pass


def _write_log(log: Path | None, name: str, text: str) -> Path:
    """`text` into the log; where that fails (a full or read-only run folder), its last 64 KiB into a
    temp-folder log, and no half a log left."""
    f, where = _open_log(log, name)
    try:
        f.write(text)
        wrote = True
    except OSError:
        wrote = False
    if _close(f) and wrote:
        return where
    _drop(where)
    f, where = _open_log(None, name)
    f.write(text[-65536:])
    f.close()
    return where


def _start(argv: list[str], what: str, **kw) -> subprocess.Popen:
    try:
        return subprocess.Popen(argv, text=True, errors="replace", **kw)
    except OSError as exc:
        raise ToolError(f"{what}: cannot start {argv[0]}: {exc}") from None


def _run_logged(argv: list[str], what: str, log: Path | None, env: dict | None) -> tuple[int, str, Path]:
    """Run argv, its stdout and stderr written to the log as they come (`tail -f` shows the
    progress); returns (exit code, the output's last lines, the log)."""
    name = log.stem if log else Path(argv[0]).name
    f, where = _open_log(log, name)
    tail: collections.deque[str] = collections.deque(maxlen=400)
    lost = False
    proc = _start(argv, what, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    try:
        for line in proc.stdout:
            tail.append(line)
            if not lost:
                try:
                    f.write(line)
                    f.flush()
                except OSError:
                    lost = True
        code = proc.wait()
    except BaseException:  # SIGTERM, Ctrl-C: the tool goes too
        proc.kill()
        proc.wait()
        _close(f)
        raise
    finally:
        proc.stdout.close()
    if not _close(f) or lost:  # the log met a full disk: its last lines, whole, in the temp folder
        _drop(where)
        where = _write_log(None, name, "".join(tail))
    return code, "".join(tail), where


def run_tool(argv: list[str], what: str, capture: bool = False, env: dict | None = None,
             log: Path | None = None, writes: Path | None = None) -> tuple[str, str]:
    """Run a llama.cpp program. Its output goes to the log file `log` (a temp file when None, kept
    only when the tool fails), or (capture) comes back as (stdout, stderr) and is logged too. A failure is one line naming the
    log, and the cause where it is known: a full disk at `writes` (the folder the tool writes in)."""
    argv = [str(a) for a in argv]
    out = err = ""
    if capture:
        proc = _start(argv, what, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        try:
            out, err = proc.communicate()
        except BaseException:  # SIGTERM, Ctrl-C: the tool goes too
            proc.kill()
            proc.wait()
            raise
        code, text = proc.returncode, (out or "") + (err or "")
        where = _write_log(log, log.stem if log else Path(argv[0]).name, text)
    else:
        code, text, where = _run_logged(argv, what, log, env)
    if code != 0:
        full = disk_full(ToolError(text[-65536:]), writes)
        if full:
            raise ToolError(f"{what}: disk full at {writes} ({full}); its output: {where}")
        lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
        raise ToolError(f"{where}: {what} failed (exit {code}){': ' + lines[-1][:200] if lines else ''}")
    if where != log:  # a temp-folder log is for a failure only
        where.unlink(missing_ok=True)
    return out or "", err or ""


def _shown(folder: Path) -> Path:
    """The folder a user knows of the temp folder a tool writes in (`.NAME.partial-PID`, removed
    after a failure): its parent."""
    while folder.name.startswith(".") and folder != folder.parent:
        folder = folder.parent
    return folder


def _converter_env() -> dict:
    env = dict(os.environ)
    env.pop("NO_LOCAL_GGUF", None)  # the converter must use the gguf-py of its own tree
    return env


def convert(tools: Tools, model_dir: Path, outfile: Path, outtype: str, mmproj: bool = False) -> None:
    """The HF folder as one GGUF of `outtype`; `mmproj`: its vision projector (tower + projector) instead."""
    step = f"convert-{'mmproj-' if mmproj else ''}{outtype}"
    run_tool([sys.executable, tools.converter, model_dir, "--outfile", outfile, "--outtype", outtype,
              *(["--mmproj"] if mmproj else [])],
             f"convert_hf_to_gguf.py ({'--mmproj ' if mmproj else ''}{outtype})", env=_converter_env(),
             log=tools.log(step), writes=_shown(Path(outfile).parent))


def projector_architectures(tools: Tools) -> set[str]:
    """The HF architectures whose vision projector this llama.cpp's converter writes (`--mmproj`): the
    converter's own list (`--print-supported-models`, its "MMPROJ models:" part), not a table of ours."""
    out, err = run_tool([sys.executable, tools.converter, "--print-supported-models"],
                        "convert_hf_to_gguf.py --print-supported-models", capture=True, env=_converter_env())
    lines = (out + "\n" + err).splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.strip() == "MMPROJ models:"), None)
    if start is None:
        return set()
    found = set()
    for ln in lines[start + 1:]:
        if not ln.strip().startswith("- "):
            break
        found.add(ln.strip()[2:].strip())
    return found


def quantize(tools: Tools, src: Path, dst: Path, qtype: str, threads: int | None = None) -> None:
    run_tool([tools.bin("llama-quantize"), src, dst, qtype.upper(), str(threads or os.cpu_count() or 1)],
             f"llama-quantize {qtype}", log=tools.log(f"quantize-{qtype}"),
             writes=_shown(Path(dst).parent))


_PPL = re.compile(r"Final estimate: PPL = ([0-9.]+(?:e[+-]?\d+)?) \+/- ([0-9.]+(?:e[+-]?\d+)?)")


def perplexity(tools: Tools, gguf: Path, text_file: Path, ctx: int, threads: int | None = None) -> dict:
    out = "\n".join(run_tool([tools.bin("llama-perplexity"), "-m", gguf, "-f", text_file, "-c", str(ctx),
                    "-b", str(max(ctx, 512)), "-t", str(threads or os.cpu_count() or 1), "--no-warmup"],
                   f"llama-perplexity on {gguf.name}", capture=True, log=tools.log(f"perplexity-{gguf.stem}")))
    m = _PPL.search(out)
    if not m:
        last = [ln.strip() for ln in out.splitlines() if ln.strip()][-1:] or ["(no output)"]
        raise ToolError(f"llama-perplexity on {gguf.name}: no 'Final estimate' line in its output "
                        f"(last: {last[0][:200]})")
    tokens = re.search(r"calculating perplexity over (\d+) chunks, n_ctx=(\d+)", out)
    chunks = int(tokens.group(1)) if tokens else None
    return {"ppl": float(m.group(1)), "ppl_err": float(m.group(2)), "ctx": ctx, "chunks": chunks,
            "scored_tokens": chunks * (ctx - 1 - ctx // 2) if chunks else None}


def complete(tools: Tools, gguf: Path, prompt: str, n: int, seed: int = 0) -> str:
    """Greedy completion of `prompt` (no chat template, no conversation mode)."""
    out, _ = run_tool([tools.bin("llama-completion"), "-m", gguf, "-p", prompt, "-n", str(n), "--temp", "0",
                    "--seed", str(seed), "-no-cnv", "--no-display-prompt", "--no-warmup", "-t",
                    str(os.cpu_count() or 1)],
                   f"llama-completion on {gguf.name}", capture=True, log=tools.log(f"completion-{gguf.stem}"))
    return out.strip()
