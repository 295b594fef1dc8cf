"""``python -m diffusion_fuse inspect MODULE:CALLABLE``: a user's function builds the model and its inputs.

CALLABLE() returns ``(model, kwargs)`` or ``(model, args, kwargs)``; MODULE is a dotted name importable from the
current directory or a ``.py`` path. The CLI runs the model eagerly and compiled and prints the report, as for
``--model``. Also: what it says for a callable that returns something else, and for ``--model`` without the
``[diffusers]`` extra (diffusers hidden in a subprocess).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from diffusion_fuse.__main__ import main

ROOT = Path(__file__).resolve().parents[1]

USER_MODELS = '''
import torch


class AdaLN(torch.nn.Module):
    def __init__(self, dim=32):
        super().__init__()
        self.norm = torch.nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.proj = torch.nn.Linear(dim, 2 * dim)

    def forward(self, x, emb):
        scale, shift = self.proj(emb).chunk(2, dim=-1)
        return self.norm(x) * (1 + scale[:, None]) + shift[:, None]


def _inputs():
    g = torch.Generator().manual_seed(0)
    return torch.randn(2, 8, 32, generator=g), torch.randn(2, 32, generator=g)


def build_kwargs():
    torch.manual_seed(0)
    x, emb = _inputs()
    return AdaLN().eval(), {"x": x, "emb": emb}


def build_args():
    torch.manual_seed(0)
    return AdaLN().eval(), _inputs(), {}


def build_wrong():
    return AdaLN()
'''


@pytest.fixture
def user_dir(tmp_path, monkeypatch):
    """A directory holding the user's module (a name of its own), as the current directory; sys.path restored."""
    name = f"user_models_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(USER_MODELS)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    yield tmp_path, name
    sys.modules.pop(name, None)


def summary_row(out: str, family: str) -> list[str]:
    return next(ln.split()[1:] for ln in out.splitlines() if ln.split()[:1] == [family])


def test_a_module_callable_returning_model_and_kwargs(user_dir, capsys):
    _, name = user_dir
    assert main(["inspect", f"{name}:build_kwargs"]) == 0
    out = capsys.readouterr().out
    assert f"diffusion_fuse inspect: {name}:build_kwargs, quality lossless" in out
    assert summary_row(out, "norm_modulate")[:3] == ["1", "1", "0"]  # matched, kept, rejected
    assert "output: bit-identical to eager" in out


def test_a_py_path_callable_returning_model_args_and_kwargs(user_dir, capsys):
    tmp, name = user_dir
    report = tmp / "report.json"
    assert main(["inspect", f"{tmp / name}.py:build_args", "--json", str(report)]) == 0
    out = capsys.readouterr().out
    assert "output: bit-identical to eager" in out
    data = json.loads(report.read_text())
    (graph,) = data["graphs"]
    assert [s["pattern"] for s in graph["sites"].values()].count("norm_modulate") == 1


@pytest.mark.parametrize("target,message", [
    ("{name}:build_wrong", "returned AdaLN, not (model, kwargs) or (model, args, kwargs)"),
    ("{name}:no_such_function", "has no no_such_function"),
    ("{name}", "is not MODULE:CALLABLE"),
    ("missing_dir/models.py:build", "no file missing_dir/models.py"),
])
def test_what_a_wrong_target_says(user_dir, target, message):
    _, name = user_dir
    with pytest.raises(SystemExit) as e:
        main(["inspect", target.format(name=name)])
    assert message in str(e.value.code)


HIDE_DIFFUSERS = '''
import importlib.abc
import sys


class HideDiffusers(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "diffusers" or name.startswith("diffusers."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, HideDiffusers())
from diffusion_fuse.__main__ import main

sys.exit(main(["inspect", "--model", "flux"]))
'''


def test_the_tiny_models_without_diffusers_name_the_extra():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(HIDE_DIFFUSERS)], env=env, capture_output=True,
                          text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "diffusers is not installed" in proc.stderr and "pip install 'diffusion-fuse[diffusers]'" in proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
