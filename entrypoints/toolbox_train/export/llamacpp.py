"""llama.cpp's own tools, run as separate processes: the HF -> GGUF converter, llama-quantize,
llama-perplexity and llama-completion.

The image installs them under /opt/llama.cpp (bin/ + convert_hf_to_gguf.py + conversion/ +
gguf-py/, the layout of a llama.cpp source tree); `--llama-cpp DIR` or $LLAMA_CPP_DIR point
elsewhere (the host tests build the same layout into a cache folder).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from ..cli import ToolError, UserError

DEFAULT_DIR = "/opt/llama.cpp"

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


def _stderr_fd():
    try:
        sys.stderr.flush()
        return sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):  # a stream without a descriptor (captured)
        return None


def run_tool(argv: list[str], what: str, capture: bool = False, env: dict | None = None) -> tuple[str, str]:
    """Run a llama.cpp program: its own progress goes to our stderr, or (capture) comes back as
    (stdout, stderr)."""
    fd = None if capture else _stderr_fd()
    pipe = subprocess.PIPE if fd is None else fd
    try:
        cp = subprocess.run([str(a) for a in argv], stdout=pipe, stderr=pipe, text=True, env=env,
                            errors="replace")
    except OSError as exc:
        raise ToolError(f"{what}: cannot start {argv[0]}: {exc}") from None
    if not capture and fd is None:
        sys.stderr.write((cp.stdout or "") + (cp.stderr or ""))
    if cp.returncode != 0:
        # One line: the tool's own output went to stderr above (or is its last line, captured).
        lines = [ln.strip() for ln in ((cp.stdout or "") + (cp.stderr or "")).splitlines() if ln.strip()]
        raise ToolError(f"{what} failed (exit {cp.returncode}){': ' + lines[-1][:200] if lines else ''}")
    return cp.stdout or "", cp.stderr or ""


def convert(tools: Tools, model_dir: Path, outfile: Path, outtype: str) -> None:
    env = dict(os.environ)
    env.pop("NO_LOCAL_GGUF", None)  # the converter must use the gguf-py of its own tree
    run_tool([sys.executable, tools.converter, model_dir, "--outfile", outfile, "--outtype", outtype],
             f"convert_hf_to_gguf.py ({outtype})", env=env)


def quantize(tools: Tools, src: Path, dst: Path, qtype: str, threads: int | None = None) -> None:
    run_tool([tools.bin("llama-quantize"), src, dst, qtype.upper(), str(threads or os.cpu_count() or 1)],
             f"llama-quantize {qtype}")


_PPL = re.compile(r"Final estimate: PPL = ([0-9.]+(?:e[+-]?\d+)?) \+/- ([0-9.]+(?:e[+-]?\d+)?)")


def perplexity(tools: Tools, gguf: Path, text_file: Path, ctx: int, threads: int | None = None) -> dict:
    out = "\n".join(run_tool([tools.bin("llama-perplexity"), "-m", gguf, "-f", text_file, "-c", str(ctx),
                    "-b", str(max(ctx, 512)), "-t", str(threads or os.cpu_count() or 1), "--no-warmup"],
                   f"llama-perplexity on {gguf.name}", capture=True))
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
                   f"llama-completion on {gguf.name}", capture=True)
    return out.strip()
