"""docs/adding_a_family.md is true: its files, plus its one line in the family list, make a family that passes the
layout and conformance tests, in a copy of the package (the product does not ship the template family)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "adding_a_family.md"
BLOCK = re.compile(r"<!-- (file|line): ([^,>]+?)(?:, in (\w+))? -->\n```python\n(.*?)```", re.S)


def doc_changes() -> tuple[dict[str, str], list[tuple[str, str, str]]]:
    """The new files the page writes ({path: text}) and the lines it adds ([(path, list name, line)])."""
    files, lines = {}, []
    for kind, path, where, body in BLOCK.findall(DOC.read_text()):
        if kind == "file":
            files[path.strip()] = body
        else:
            lines.append((path.strip(), where, body.rstrip("\n")))
    return files, lines


def test_the_template_family_is_new_files_and_one_line(tmp_path):
    files, lines = doc_changes()
    assert sorted(files) == ["diffusion_fuse/kernels/silu_mul.py", "diffusion_fuse/lowering/silu_mul.py",
                             "diffusion_fuse/patterns/silu_mul.py", "tests/test_silu_mul_pattern.py"]
    assert not any((ROOT / p).exists() for p in files)  # new files only
    assert len(lines) == 1 and lines[0][0] == "diffusion_fuse/families.py"
    shutil.copytree(ROOT / "diffusion_fuse", tmp_path / "diffusion_fuse", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "tests", tmp_path / "tests", ignore=shutil.ignore_patterns("__pycache__"))
    for path, text in files.items():
        (tmp_path / path).write_text(text)
    path, name, line = lines[0]
    src = (tmp_path / path).read_text()
    head, sep, rest = src.partition(f"{name}: tuple[str, ...] = (\n")
    (tmp_path / path).write_text(head + sep + line + "\n" + rest)
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    env.pop("TRITON_INTERPRET", None)
    tests = ["tests/test_silu_mul_pattern.py", "tests/test_layout.py", "tests/test_families.py"]
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests,
                          "-k", "silu_mul or test_layout"], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert "silu_mul" in subprocess.run([sys.executable, "-c", "import diffusion_fuse as d; print(sorted("
                                         "d.patterns.REGISTRY.names()))"], cwd=tmp_path, env=env,
                                        capture_output=True, text=True).stdout
