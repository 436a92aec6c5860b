"""bnb-check.py [--hip MAJOR.MINOR]: bitsandbytes carries the native library for exactly this
torch, loads it, and its 4-bit path works. Run by the image build (runtime/bitsandbytes.j2) and
by tests/test_bnb_source.py on the host's CPU build of the same pinned source.

- HIP torch: the library is libbitsandbytes_rocm<major><minor>.so of torch.version.hip (--hip:
  the stack's HIP, which must be that), picked by bitsandbytes' own rule (get_cuda_bnb_library_path:
  a missing exact build falls back to another HIP's with only a warning, and such a fallback was
  seen crashing, unsloth #10273), present, and loaded against this image's ROCm. With a GPU
  visible a 4-bit (NF4) matmul is called and compared with the dequantized weight's; without one
  (an image build) the library's 4-bit entry points are looked up instead.
- CPU torch: libbitsandbytes_cpu.so, and a 4-bit layer runs on the CPU through it.
Exit 1 with one line naming what is wrong.
"""

import argparse
import ctypes
import os
import sys

import torch

GPU_SYMBOLS = ("cquantize_blockwise_bf16_nf4", "cdequantize_blockwise_bf16_nf4", "cgemm_4bit_inference_naive_bf16")
CPU_SYMBOLS = ("cdequantize_blockwise_cpu_nf4_fp32", "cquantize_blockwise_cpu_fp32")


def fail(msg: str) -> None:
    print(f"bnb-check: {msg}", file=sys.stderr)
    sys.exit(1)


def picked_library(hip: str | None):
    from bitsandbytes.consts import PACKAGE_DIR
    if hip is None:
        return PACKAGE_DIR / "libbitsandbytes_cpu.so"
    from bitsandbytes.cextension import get_cuda_bnb_library_path
    from bitsandbytes.cuda_specs import CUDASpecs, get_cuda_version_string, get_cuda_version_tuple
    # The specs as bitsandbytes builds them from torch.version.hip; no GPU needed.
    return get_cuda_bnb_library_path(CUDASpecs((0, 0), get_cuda_version_string(), get_cuda_version_tuple()))


def layer_4bit(device: str) -> float:
    """Largest error of a Linear4bit (NF4) against the same layer on its dequantized weight."""
    import bitsandbytes as bnb
    import bitsandbytes.functional as F
    torch.manual_seed(0)
    dense = torch.nn.Linear(128, 64, bias=False)
    layer = bnb.nn.Linear4bit(128, 64, bias=False, compute_dtype=torch.float32, quant_type="nf4")
    layer.weight = bnb.nn.Params4bit(dense.weight.data.clone(), requires_grad=False, quant_type="nf4")
    layer = layer.to(device)  # quantizes the weight
    err = 0.0
    # One row takes bitsandbytes' 4-bit GEMV kernel (inference), four rows dequantize and matmul.
    for rows in (1, 4):
        x = torch.randn(rows, 128, device=device)
        with torch.no_grad():
            y = layer(x)
            w = F.dequantize_4bit(layer.weight.data, layer.weight.quant_state).to(torch.float32)
            ref = x @ w.t()
        if y.shape != (rows, 64) or not torch.isfinite(y).all():
            fail(f"the 4-bit layer on {device} gave {tuple(y.shape)}, finite: {bool(torch.isfinite(y).all())}")
        err = max(err, (y - ref).abs().max().item())
    # NF4 must change the weight (it was quantized) but stay close to it.
    drift = (w.cpu() - dense.weight).abs().max().item()
    if not 0 < drift < 0.05:
        fail(f"the 4-bit weight on {device} differs from the dense one by {drift} (expected a small, non-zero error)")
    if err > 1e-3:
        fail(f"the 4-bit layer on {device} is {err:.2e} off the dequantized weight's result")
    return err


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hip", help="the stack's HIP major.minor; torch.version.hip must agree")
    args = p.parse_args()
    if "BNB_ROCM_VERSION" in os.environ:
        fail("BNB_ROCM_VERSION is set: it overrides bitsandbytes' choice of library; unset it")
    hip = torch.version.hip
    if hip:
        hip = ".".join(str(hip).split(".")[:2])
        if args.hip and args.hip != hip:
            fail(f"torch.version.hip is {torch.version.hip}, the stack says HIP {args.hip}")
        want = f"libbitsandbytes_rocm{hip.replace('.', '')}.so"
    else:
        want = "libbitsandbytes_cpu.so"
    import bitsandbytes
    lib = picked_library(hip)
    if lib.name != want or not lib.is_file():
        fail(f"bitsandbytes {bitsandbytes.__version__} has no {want} for "
             f"{'HIP ' + str(torch.version.hip) if hip else 'CPU torch'} (it picked {lib.name}"
             f"{'' if lib.is_file() else ', absent'}): pin a bitsandbytes with that build, or build it from source")
    try:
        handle = ctypes.CDLL(str(lib))
    except OSError as e:
        fail(f"cannot load {lib}: {e}")
    if not hip or torch.cuda.is_available():
        # Without a GPU a HIP torch's bitsandbytes loads its CPU library (or none) on import.
        from bitsandbytes.cextension import lib as loaded
        if getattr(getattr(loaded, "_lib", None), "_name", None) != str(lib):
            fail(f"bitsandbytes did not load {lib} on import ({type(loaded).__name__})")
    if hip and torch.cuda.is_available():
        err = layer_4bit("cuda")
        how = f"4-bit matmul on {torch.cuda.get_device_name(0)}: max error {err:.2e} against the dequantized weight"
    else:
        missing = [s for s in (GPU_SYMBOLS if hip else CPU_SYMBOLS) if not hasattr(handle, s)]
        if missing:
            fail(f"{lib} lacks {', '.join(missing)}")
        how = "no GPU visible: 4-bit entry points present"
        if not hip:
            how = f"4-bit layer on the CPU: max error {layer_4bit('cpu'):.2e} against the dequantized weight"
    print(f"bitsandbytes {bitsandbytes.__version__}: {lib} ({'HIP ' + str(torch.version.hip) if hip else 'CPU'}); {how}")


if __name__ == "__main__":
    main()
