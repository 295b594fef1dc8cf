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
