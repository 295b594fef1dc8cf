"""Shared plumbing of the pipeline examples: arguments, the eager-vs-compiled run, the bitwise check, the report.

Each ``examples/<pipeline>.py`` builds a tiny random-weight pipeline (nothing is downloaded) and calls
:func:`main`, which

1. runs the pipeline eagerly (full denoising loop + VAE decode, ``output_type="pt"``),
2. compiles the transformer with ``backend="diffusion_fuse"``: the whole model with
   ``torch.compile(pipe.transformer, ...)``, or, with ``--repeated-blocks``, only its repeated blocks with
   diffusers' ``pipe.transformer.compile_repeated_blocks(backend="diffusion_fuse")``,
3. runs the pipeline again with the same seeds and compares the final image/video tensor bit for bit,
4. prints ``diffusion_fuse.report_of(pipe.transformer).table()`` and one summary line containing
   ``bit-identical to eager: True|False``; exits with status 1 when the outputs differ.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
import warnings
from collections.abc import Callable

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")  # both read at import: before diffusers is imported
os.environ.setdefault("DIFFUSERS_VERBOSITY", "error")

import torch  # noqa: E402

import diffusion_fuse  # noqa: E402

warnings.filterwarnings("ignore")
logging.getLogger("diffusers").setLevel(logging.ERROR)

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def repeated_blocks_of(transformer_cls: type) -> list[str]:
    """The block class names ``compile_repeated_blocks`` compiles (``_repeated_blocks``), empty if unsupported."""
    return list(getattr(transformer_cls, "_repeated_blocks", None) or [])


def parse_args(doc: str, transformer_cls: type, *, steps: int = 3,
               add_arguments: Callable[[argparse.ArgumentParser], None] | None = None,
               argv: list[str] | None = None) -> argparse.Namespace:
    """The examples' common options; ``--repeated-blocks`` is documented (or refused) from ``transformer_cls``."""
    ap = argparse.ArgumentParser(description=doc.strip().splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n".join(doc.strip().splitlines()[1:]).strip())
    ap.add_argument("--steps", type=int, default=steps, help=f"denoising steps (default {steps})")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                    help="cuda or cpu (default: cuda if available)")
    ap.add_argument("--dtype", default="bf16", choices=sorted(DTYPES), help="weights and activations (default bf16)")
    blocks = repeated_blocks_of(transformer_cls)
    if blocks:
        rb_help = (f"compile only the repeated blocks ({', '.join(blocks)}) with diffusers' "
                   f"pipe.transformer.compile_repeated_blocks(backend=\"diffusion_fuse\") instead of the whole "
                   f"transformer")
    else:
        rb_help = (f"NOT SUPPORTED for this pipeline: {transformer_cls.__name__} has no _repeated_blocks in "
                   f"diffusers 0.42.1, so compile_repeated_blocks() raises; the flag is refused")
    ap.add_argument("--repeated-blocks", action="store_true", help=rb_help)
    ap.add_argument("--quality", default="lossless", choices=["lossless", "high"],
                    help="lossless (default): the output must be bit-identical to eager. high: Inductor plus "
                         "non-exact families; the output must pass the tier-high quality gate (PSNR/SSIM vs eager, "
                         "diffusion_fuse.verify.quality.QualityGate)")
    if add_arguments is not None:
        add_arguments(ap)
    args = ap.parse_args(argv)
    if args.repeated_blocks and not blocks:
        ap.error(f"--repeated-blocks: {transformer_cls.__name__} has no _repeated_blocks in diffusers 0.42.1")
    args.torch_dtype = DTYPES[args.dtype]
    return args


def _as_bits(t: torch.Tensor) -> torch.Tensor:
    """Floating tensors as integers of the same width, so ``==`` compares bits (NaN == NaN, -0 != +0)."""
    if t.is_floating_point():
        return t.contiguous().view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])
    return t


def bitwise_diff(a: torch.Tensor, b: torch.Tensor) -> str | None:
    """``None`` when ``a`` and ``b`` are bitwise equal; otherwise what differs (shape/dtype, or count + first)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return f"eager {a.dtype}{list(a.shape)} vs compiled {b.dtype}{list(b.shape)}"
    ne = _as_bits(a.cpu()) != _as_bits(b.cpu())
    n = int(ne.sum())
    if n == 0:
        return None
    idx = tuple(int(i) for i in ne.nonzero()[0])
    return (f"{n} of {a.numel()} elements differ; first at {idx}: eager {a[idx].item()!r}, "
            f"compiled {b[idx].item()!r} (max |diff| {(a.float() - b.float()).abs().max().item():.3g})")


def _timed(fn, device: str):
    t0 = time.perf_counter()
    out = fn()
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()
    return out, time.perf_counter() - t0


def _fmt_shape(t: torch.Tensor) -> str:
    return f"{str(t.dtype).removeprefix('torch.')}{list(t.shape)}"


def main(args: argparse.Namespace, *, name: str,
         build_pipeline: Callable[[torch.dtype, str], object],
         generate: Callable[[object, argparse.Namespace], torch.Tensor]) -> None:
    """Run ``generate`` eagerly, compile the transformer, run it again, check bits, print the report.

    ``build_pipeline(dtype, device)`` returns the pipeline; ``generate(pipe, args)`` runs it (same seeds every call)
    and returns the final image/video tensor. Exits with status 1 if the two outputs are not bitwise equal.
    """
    pipe = build_pipeline(args.torch_dtype, args.device)
    if hasattr(pipe, "set_progress_bar_config"):
        pipe.set_progress_bar_config(disable=True)

    eager, t_eager = _timed(lambda: generate(pipe, args), args.device)

    options = {"quality": args.quality}
    if args.repeated_blocks:
        pipe.transformer.compile_repeated_blocks(backend="diffusion_fuse", options=options)
        mode = f"compile_repeated_blocks ({', '.join(repeated_blocks_of(type(pipe.transformer)))})"
    else:
        pipe.transformer = torch.compile(pipe.transformer, backend="diffusion_fuse", options=options)
        mode = "torch.compile(transformer)"
    mode += f", quality {args.quality}"

    fused, t_fused = _timed(lambda: generate(pipe, args), args.device)

    diff = bitwise_diff(eager, fused)
    try:
        report = diffusion_fuse.report_of(pipe.transformer)  # every block's graphs with compile_repeated_blocks
    except ValueError:  # a torch that gives a compile no report of its own
        report = diffusion_fuse.last_report()
    print(report.table())
    print(f"\n{args.steps}-step tiny {name} on {args.device} ({args.dtype}), {mode}: output {_fmt_shape(fused)}, "
          f"{len(report.graphs)} graph(s) compiled; eager {t_eager:.1f}s, compiled (incl. compile) {t_fused:.1f}s")
    if not report.graphs:  # nothing went through the backend: equality would prove nothing
        print("bit-identical to eager: not checked", file=sys.stderr)
        raise SystemExit("no graph was compiled with backend=\"diffusion_fuse\"")
    if args.quality == "high":
        from diffusion_fuse.verify.quality import QualityGate

        gate = QualityGate()
        m = gate.measure(eager.float(), fused.float())
        print(f"vs eager: PSNR {m['psnr']:.1f} dB, SSIM {m['ssim']:.4f}; tier-high quality gate "
              f"(PSNR >= {gate.min_psnr}, SSIM >= {gate.min_ssim}) passed: {m['passed']}")
        if not m["passed"]:
            raise SystemExit(1)
        return
    print(f"bit-identical to eager: {diff is None}")
    if diff is not None:
        print(f"compiled output differs from eager: {diff}", file=sys.stderr)
        raise SystemExit(1)
