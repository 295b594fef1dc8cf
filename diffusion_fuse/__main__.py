"""Command line: see what diffusion_fuse does to a model.

    python -m diffusion_fuse inspect --model flux [--dtype bf16|fp32] [--html report.html] [--json report.json]
    python -m diffusion_fuse inspect my_models:build_model      (or path/to/my_models.py:build_model)
    python -m diffusion_fuse inspect --script my_pipeline.py [script args...]
    python -m diffusion_fuse profile --model flux [--dtype bf16|fp32] [--forwards N] [--html p.html] [--json p.json]
    python -m diffusion_fuse profile my_models:build_model
    python -m diffusion_fuse profile --script my_model.py [script args...]
    python -m diffusion_fuse census [--models a,b] [--dtype bf16|fp32] [--json F]
    diffusion-fuse inspect ...                      (the same, as an installed console script)

``--model NAME`` builds a tiny random-weight model (diffusion_fuse.testing.tiny_models; the
``[diffusers]`` extra), runs it eagerly and compiled with the backend, and prints the report: the
summary per pattern family, every site (source, ATen ops before, op after, shapes, verdict), near
misses, kernel calls, and whether the output is bit-identical to eager. ``MODULE:CALLABLE`` does the
same for your own model: it imports MODULE (a dotted name importable from the current directory, or
a ``.py`` path) and calls CALLABLE with no arguments, which returns ``(model, kwargs)`` or ``(model,
args, kwargs)``: the model as it should run (eval mode, on its device and dtype) and the inputs of one
forward call, ``model(*args, **kwargs)``. ``--script PATH`` runs a script (as
``__main__``, with the arguments that follow it) and prints ``diffusion_fuse.process_report()``:
every graph the script compiled with diffusion_fuse. ``--diff`` adds the per-site
before/after diff and the graph code diff; ``--html`` writes all of it as one self-contained
HTML file; ``--fault op:kind[:index]`` injects a fault (see lowering/faults.py).

``profile`` runs ``diffusion_fuse.profile`` (diffusion_fuse/profile.py): the model eager, compiled by diffusion_fuse
(lossless, with and without CUDA graphs on a GPU) and by Inductor, under torch.profiler, and prints where each
variant's time goes per class (GEMM, attention, convolution, our families, eager ATen ops left unfused per op and
per source line with what Inductor made of that line, copies, host gaps), each memory-bound class with its HBM
floor, sorted by the time above it. ``--model NAME`` profiles a tiny model, ``MODULE:CALLABLE`` your own (as for
``inspect``); ``--script PATH`` runs a script (as
``__main__``, with the arguments that follow it) that calls ``diffusion_fuse.profile`` and prints every report it
made; ``--html`` and ``--json`` write the last one.

``census`` compiles models of the diffusers zoo (diffusion_fuse.testing.zoo; all of them unless ``--models``)
and prints per model the sites each family kept and the eager ATen ops left unfused (diffusion_fuse/census.py).
"""

from __future__ import annotations

import argparse
import os
import runpy
import sys
from collections.abc import Sequence
from typing import Any

DTYPES = ("bf16", "fp32")


def _parser() -> argparse.ArgumentParser:
    from .testing.tiny_models import MODEL_NAMES

    ap = argparse.ArgumentParser(prog="diffusion-fuse", description="Inspect what diffusion_fuse does to a model.")
    sub = ap.add_subparsers(dest="command", metavar="COMMAND")
    ins = sub.add_parser("inspect", help="compile and run a model once; print what the backend changed",
                         description=__doc__.split("\n\n")[2].replace("\n", " ").replace("``", ""))
    what = ins.add_mutually_exclusive_group(required=True)
    what.add_argument("target", nargs="?", metavar="MODULE:CALLABLE",
                      help="your model: CALLABLE() returns (model, kwargs) or (model, args, kwargs); MODULE is a "
                           "dotted module name or a .py path")
    what.add_argument("--model", choices=MODEL_NAMES, help="a tiny random-weight model")
    what.add_argument("--script", nargs=argparse.REMAINDER, metavar="PATH [ARGS]",
                      help="run a Python script (and its arguments; put every other option before --script)")
    ins.add_argument("--dtype", choices=DTYPES, default="bf16", help="dtype of the tiny model (default bf16)")
    ins.add_argument("--seed", type=int, default=0, help="seed of the tiny model's weights and inputs")
    ins.add_argument("--quality", choices=("lossless", "high"), default="lossless")
    ins.add_argument("--no-verify", action="store_true", help="run the rewritten graph without verifying it")
    ins.add_argument("--fault", metavar="OP:KIND[:INDEX]",
                     help="inject a fault into a built-in op, e.g. norm_modulate:perturb:3 or norm_modulate:raise "
                          "(see lowering/faults.py)")
    ins.add_argument("--diff", action="store_true", help="also print the per-site and graph code diffs")
    ins.add_argument("--html", metavar="PATH", help="write the report as one self-contained HTML file")
    ins.add_argument("--json", metavar="PATH", help="write the report as JSON")
    prof = sub.add_parser("profile", help="where a forward's time goes: eager, diffusion_fuse and Inductor, per class",
                          description=__doc__.split("\n\n")[3].replace("\n", " ").replace("``", ""))
    what = prof.add_mutually_exclusive_group(required=True)
    what.add_argument("target", nargs="?", metavar="MODULE:CALLABLE",
                      help="your model: CALLABLE() returns (model, kwargs) or (model, args, kwargs), as for inspect")
    what.add_argument("--model", choices=MODEL_NAMES, help="a tiny random-weight model")
    what.add_argument("--script", nargs=argparse.REMAINDER, metavar="PATH [ARGS]",
                      help="run a Python script that calls diffusion_fuse.profile (put every other option before "
                           "--script)")
    prof.add_argument("--dtype", choices=DTYPES, default="bf16", help="dtype of the tiny model (default bf16)")
    prof.add_argument("--seed", type=int, default=0, help="seed of the tiny model's weights and inputs")
    prof.add_argument("--forwards", type=int, default=3, help="profiled forwards per variant (default 3)")
    prof.add_argument("--warmup", type=int, default=3, help="calls before profiling (default 3)")
    prof.add_argument("--html", metavar="PATH", help="write the report as one self-contained HTML file")
    prof.add_argument("--json", metavar="PATH", help="write the report as JSON")
    cen = sub.add_parser("census", help="per zoo model: sites kept per family, eager ATen ops left unfused",
                         description=__doc__.split("\n\n")[4].replace("\n", " ").replace("``", ""))
    cen.add_argument("--models", metavar="A,B", help="zoo models, comma-separated (default: the whole zoo)")
    cen.add_argument("--dtype", choices=DTYPES, default="bf16", help="dtype of the models (default bf16)")
    cen.add_argument("--json", metavar="PATH", help="write the census as JSON")
    return ap


def _bitwise(ref: Any, out: Any):
    from .verify.compare import compare_bitwise

    return compare_bitwise(list(ref) if isinstance(ref, tuple) else ref, list(out) if isinstance(out, tuple) else out)


# What the tiny models import, and the extra of pyproject.toml that installs it
EXTRAS = {"diffusers": "diffusers", "transformers": "diffusers"}


def _missing_extra(e: ImportError) -> str | None:
    """The message for an ImportError of a module the tiny models' extra installs, or None for any other."""
    top = (e.name or "").split(".")[0]
    if top not in EXTRAS:
        return None
    return (f"diffusion-fuse: {top} is not installed ({e}); the tiny models need the [{EXTRAS[top]}] extra: "
            f"pip install 'diffusion-fuse[{EXTRAS[top]}]'")


def _build_tiny(name: str, dtype_name: str, seed: int):
    import torch

    from .testing.tiny_models import build

    dtype = torch.bfloat16 if dtype_name == "bf16" else torch.float32
    try:
        return build(name, dtype, seed=seed)
    except ImportError as e:
        message = _missing_extra(e)
        if message is None:
            raise
        raise SystemExit(message) from e


def load_callable(target: str) -> Any:
    """``MODULE:CALLABLE``'s callable: MODULE a dotted name (importable from the current directory) or a .py path."""
    import importlib
    import importlib.util

    module_name, sep, attr = target.rpartition(":")
    if not sep or not module_name or not attr:
        raise SystemExit(f"diffusion-fuse: {target!r} is not MODULE:CALLABLE")
    if module_name.endswith(".py") or os.path.sep in module_name:
        path = os.path.abspath(module_name)
        if not os.path.isfile(path):
            raise SystemExit(f"diffusion-fuse: no file {module_name}")
        sys.path.insert(0, os.path.dirname(path))  # the file's own imports resolve as when it runs as a script
        spec = importlib.util.spec_from_file_location(os.path.splitext(os.path.basename(path))[0], path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    else:
        if "" not in sys.path and os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())  # as `python -m` would: modules of the current directory
        module = importlib.import_module(module_name)
    fn = module
    for part in attr.split("."):
        if not hasattr(fn, part):
            raise SystemExit(f"diffusion-fuse: {module_name} has no {attr}")
        fn = getattr(fn, part)
    if not callable(fn):
        raise SystemExit(f"diffusion-fuse: {target} is not callable")
    return fn


def model_and_inputs(built: Any, target: str) -> tuple[Any, tuple, dict]:
    """``(model, args, kwargs)`` from what a user's callable returned: ``(model, kwargs)`` or ``(model, args,
    kwargs)``."""
    shape = "(model, kwargs) or (model, args, kwargs)"
    if not isinstance(built, (tuple, list)) or len(built) not in (2, 3):
        raise SystemExit(f"diffusion-fuse: {target} returned {type(built).__name__}, not {shape}")
    model, *inputs = built
    args, kwargs = ((), inputs[0]) if len(inputs) == 1 else inputs
    if not callable(model):
        raise SystemExit(f"diffusion-fuse: {target} returned a {type(model).__name__} as its model")
    if not isinstance(args, (tuple, list)) or not isinstance(kwargs, dict):
        raise SystemExit(f"diffusion-fuse: {target} returned args {type(args).__name__} and kwargs "
                         f"{type(kwargs).__name__}; {shape} takes a tuple and a dict")
    return model, tuple(args), kwargs


def _run_model(args: argparse.Namespace) -> tuple[Any, list[str], int, list[str]]:
    import logging
    import warnings

    import torch

    from . import DiffusionFuseBackend, Report

    if args.model:
        warnings.filterwarnings("ignore")
        logging.getLogger("diffusers").setLevel(logging.ERROR)
        model, kwargs = _build_tiny(args.model, args.dtype, args.seed)
        inputs: tuple = ()
        what = f"tiny {args.model} ({args.dtype}, random weights, seed {args.seed})"
    else:
        model, inputs, kwargs = model_and_inputs(load_callable(args.target)(), args.target)
        what = args.target
    options = {"quality": args.quality, "verify": not args.no_verify}
    report = Report()
    compiled = torch.compile(model, backend=DiffusionFuseBackend(options, report))
    with torch.no_grad():
        ref = model(*inputs, **kwargs)
        out = compiled(*inputs, **kwargs)
    head = [f"diffusion_fuse inspect: {what}, quality {args.quality}"]
    v = _bitwise(ref, out)
    tail = ["output: bit-identical to eager" if v else f"output: differs from eager ({v.detail})"
            + ("; tier high allows that within rtol/atol" if args.quality == "high" else "")]
    # A lossless, verified run that differs from eager is a bug: say so in the exit status too.
    code = 1 if (not v and args.quality == "lossless" and not args.no_verify) else 0
    return report, head + [""], code, tail


def _run_script(argv: Sequence[str]) -> tuple[Any, list[str], int, list[str]]:
    from . import Report, process_report

    if not argv:
        raise SystemExit("diffusion-fuse inspect: --script needs a path")
    path = argv[0]
    n0 = len(process_report().graphs)
    code = _run_script_file(path, list(argv[1:]))
    report = Report.combined([process_report()])
    report.graphs = report.graphs[n0:]  # the script's compiles, every one of them
    head = ["", f"diffusion_fuse inspect: script {path}" + (f" (exit status {code})" if code else "")]
    if not report.graphs:
        head.append("no graph was compiled with backend=\"diffusion_fuse\"")
    return report, head + [""], code, []


def inspect(args: argparse.Namespace) -> int:
    import contextlib

    from .lowering import faults
    from .verify import graph_diff

    ctx = contextlib.nullcontext()
    if args.fault:
        (fault,) = faults.parse(args.fault).values()
        ctx = faults.inject(fault.op, fault.kind, fault.index)
    with ctx:
        if args.model or args.target:
            report, head, code, tail = _run_model(args)
        else:
            report, head, code, tail = _run_script(args.script)
    lines = head + [report.table()]
    if args.diff:
        lines += ["", graph_diff.format_text(report)]
    if tail:
        lines += [""] + tail
    if args.html:
        report.save_html(args.html)
        lines.append(f"HTML report: {args.html}")
    if args.json:
        report.save(args.json)
        lines.append(f"JSON report: {args.json}")
    print("\n".join(lines))
    return code


def _run_script_file(path: str, rest: list[str]) -> int:
    """Run ``path`` as ``__main__`` with ``rest`` as its arguments; its exit status."""
    saved = sys.argv
    sys.argv = [path] + rest
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    code = 0
    try:
        runpy.run_path(path, run_name="__main__")
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        sys.argv = saved
    return code


def profile(args: argparse.Namespace) -> int:
    import logging
    import warnings

    from . import profile as run_profile
    from .profile import _RECENT

    if args.model:
        warnings.filterwarnings("ignore")
        logging.getLogger("diffusers").setLevel(logging.ERROR)
        model, kwargs = _build_tiny(args.model, args.dtype, args.seed)
        reports = [run_profile(model, forwards=args.forwards, warmup=args.warmup, **kwargs)]
        head = [f"diffusion_fuse profile: tiny {args.model} ({args.dtype}, random weights, seed {args.seed})", ""]
        code = 0
    elif args.target:
        model, inputs, kwargs = model_and_inputs(load_callable(args.target)(), args.target)
        reports = [run_profile(model, *inputs, forwards=args.forwards, warmup=args.warmup, **kwargs)]
        head, code = [f"diffusion_fuse profile: {args.target}", ""], 0
    else:
        if not args.script:
            raise SystemExit("diffusion-fuse profile: --script needs a path")
        n = len(_RECENT)
        code = _run_script_file(args.script[0], list(args.script[1:]))
        reports = _RECENT[n:]
        head = ["", f"diffusion_fuse profile: script {args.script[0]}" + (f" (exit status {code})" if code else ""),
                ""]
        if not reports:
            print("\n".join(head + ["the script made no diffusion_fuse.profile report"]))
            return code or 2
    lines = head + ["\n\n".join(r.table() for r in reports)]
    if args.html:
        reports[-1].save_html(args.html)
        lines.append(f"HTML report: {args.html}")
    if args.json:
        reports[-1].save(args.json)
        lines.append(f"JSON report: {args.json}")
    print("\n".join(lines))
    return code


def run_census(ap: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    import logging
    import warnings

    from . import census
    from .testing.zoo import ZOO

    names = args.models.split(",") if args.models else list(ZOO)
    unknown = [n for n in names if n not in ZOO]
    if unknown:
        ap.error(f"unknown zoo model(s) {', '.join(unknown)}; choose from {', '.join(ZOO)}")
    warnings.filterwarnings("ignore")
    logging.getLogger("diffusers").setLevel(logging.ERROR)
    rows = census.census(names, args.dtype)
    print(f"diffusion_fuse census: {len(rows)} zoo model(s), {args.dtype}, lossless tier\n")
    print(census.format_table(rows))
    if args.json:
        census.save_json(rows, args.json)
        print(f"\nJSON: {args.json}")
    # A lossless, verified run that differs from eager, or a compiled call that raises, is a bug: say so in the
    # exit status too (a model whose eager call raises on this machine is listed as not run).
    return 0 if all(r.bitwise or r.error.startswith("eager") for r in rows) else 1


def main(argv: Sequence[str] | None = None) -> int:
    ap = _parser()
    args = ap.parse_args(argv)
    if args.command == "census":
        return run_census(ap, args)
    if args.command not in ("inspect", "profile"):
        ap.print_help()
        return 2
    if args.json and not args.json.endswith(".json"):
        ap.error("--json PATH must end with .json")
    if args.command == "profile":
        return profile(args)
    if args.fault:
        from .lowering import faults

        try:
            parsed = faults.parse(args.fault)
            if len(parsed) != 1:
                raise ValueError("--fault takes one op:kind[:index]")
            from . import families

            families.load()  # the ops a fault can name
            why = faults.unknown_op_message(next(iter(parsed)))
            if why:
                raise ValueError(f"--fault: {why}")
        except ValueError as e:
            ap.error(str(e))
    return inspect(args)


if __name__ == "__main__":
    sys.exit(main())
