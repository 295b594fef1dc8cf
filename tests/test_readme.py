"""The README's code blocks that claim to run, run."""

import re
from pathlib import Path

import diffusion_fuse

README = Path(__file__).resolve().parents[1] / "README.md"


def _block(marker: str) -> str:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    (code,) = [b for b in blocks if marker in b]
    return code


def test_register_pattern_example():
    try:
        exec(compile(_block("register_pattern("), "README.md", "exec"), {})
    finally:
        diffusion_fuse.unregister_pattern("gelu_tanh_mul")


def test_guarantees_name_tests_that_exist():
    text = README.read_text()
    section = text.split("## Guarantees", 1)[1].split("\n## ", 1)[0]
    root = README.parent
    files = set(re.findall(r"`(tests/[\w/]+\.py)", section))
    assert files, "the Guarantees table names no test file"
    for f in files:
        assert (root / f).exists(), f
    sources = "\n".join(p.read_text() for p in (root / "tests").rglob("test_*.py"))
    for name in set(re.findall(r"::(test_\w+)", section)) | set(re.findall(r"`(test_\w+)`", section)):
        assert f"def {name}(" in sources, name


def test_readme_stays_short():
    assert len(README.read_bytes()) <= 15000, "README.md over 15 KB: move detail to docs/"
