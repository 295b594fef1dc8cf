"""The package's layout: stages import one way, and a family's name is its file's name in every stage.

patterns/ (what to look for) → fxpasses/ (rewrites, their order) → lowering/ (ops) → kernels/ (Triton), with
verify/ judging. A stage imports only the stages ``ALLOWED`` lists for it, plus the shared modules (``SHARED``),
which import no stage themselves.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from diffusion_fuse.families import FAMILIES
from diffusion_fuse.patterns.registry import REGISTRY

PACKAGE = Path(__file__).resolve().parents[1] / "diffusion_fuse"
ROOT = PACKAGE.parent
ALLOWED = {
    "kernels": set(),
    "lowering": {"kernels"},
    "patterns": set(),
    "verify": {"lowering"},
    "fxpasses": {"patterns", "lowering", "kernels", "verify"},
}
SHARED = {"log", "config"}


def imported_modules(source: str, module: str) -> set[str]:
    """The ``diffusion_fuse`` submodules (first component after the package) that ``source`` imports, function-level
    imports included; ``module`` is the dotted name of the file (``diffusion_fuse.kernels.rows``)."""
    found = set()
    package_parts = module.split(".")[:-1]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package_parts[: len(package_parts) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
                names = [target] if node.module else [f"{target}.{a.name}" for a in node.names]
            else:
                names = [node.module or ""]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] == "diffusion_fuse" and len(parts) > 1:
                found.add(parts[1])
    return found


def violations(source: str, module: str) -> list[str]:
    """What ``source`` (the file of ``module``) imports that its stage may not."""
    parts = module.split(".")
    own = parts[1] if len(parts) > 2 else None
    if own in ALLOWED:
        allowed = ALLOWED[own] | SHARED | {own}
    elif len(parts) == 2 and parts[1] in SHARED:
        allowed = SHARED
    else:
        return []  # the backend, the CLI, testing/: the top of the package may import anything
    return sorted(imported_modules(source, module) - allowed)


def package_modules() -> list[tuple[str, Path]]:
    return [(".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"), p)
            for p in sorted(PACKAGE.rglob("*.py"))]


def test_every_stage_imports_only_the_stages_below_it():
    bad = {m: v for m, p in package_modules() if (v := violations(p.read_text(), m))}
    assert not bad, f"imports against the stage order {ALLOWED}: {bad}"


def test_the_check_sees_a_kernel_importing_its_lowering():
    # what the check is for: a kernel module reaching up into its lowering, even inside a function
    source = "def plan(a):\n    from ..lowering.norm_modulate import can_use_norm_modulate\n"
    assert violations(source, "diffusion_fuse.kernels.norm_modulate") == ["lowering"]
    assert violations("from diffusion_fuse.patterns import REGISTRY\n", "diffusion_fuse.lowering.spec") == ["patterns"]
    assert violations("from ..kernels.rows import row_layout\n", "diffusion_fuse.lowering.rms_norm") == []


def test_facts_patterns_and_kernels_share_agree():
    # patterns/ may not import kernels/: a fact both need is stated in each and checked here
    from diffusion_fuse.kernels.fp8_quant import MAX_QUANTS
    from diffusion_fuse.patterns.quant_chain import MAX_FUSED_QUANTIZERS

    assert MAX_FUSED_QUANTIZERS == MAX_QUANTS
    from diffusion_fuse.kernels import depthwise_conv as kernel
    from diffusion_fuse.patterns import depthwise_conv as pattern

    assert pattern.NO_GLU == kernel.NO_GLU


def test_the_family_list_is_the_registry_and_its_order():
    builtin = [f.name for f in REGISTRY.families() if type(f).__module__.startswith("diffusion_fuse.patterns.")]
    assert builtin == list(FAMILIES)


@pytest.mark.parametrize("name", FAMILIES)
def test_a_familys_name_is_its_files_name_in_every_stage(name):
    fam = REGISTRY.get(name)
    assert (PACKAGE / "patterns" / f"{name}.py").is_file() and type(fam).__module__ == f"diffusion_fuse.patterns.{name}"
    assert (PACKAGE / "lowering" / f"{name}.py").is_file()
    kernel = fam.kernel_module()
    if kernel is not None:
        assert (PACKAGE / "kernels" / f"{kernel}.py").is_file(), f"{name}: kernels/{kernel}.py"
    assert (PACKAGE / "fxpasses" / f"{name}.py").is_file() == fam.found_by_pass
    suffixes = ("", "_pattern", "_pass", "_kernel", "_gpu")
    assert [p for p in (ROOT / "tests").rglob(f"test_{name}*.py") if p.stem in {f"test_{name}{x}" for x in suffixes}], \
        f"no tests/**/test_{name}[_pattern|_pass|_kernel|_gpu].py"
    # the family's op(s) are named after it
    assert any(op == name or op.startswith(f"{name}_") for op in ops_of(name)), ops_of(name)


def ops_of(family: str) -> list[str]:
    from diffusion_fuse.lowering.spec import SPECS

    module = f"diffusion_fuse.lowering.{family}"
    return [n for n, s in SPECS.items() if s.reference.__module__ in (module, "diffusion_fuse.lowering.fp8")
            and n.startswith(family)]
