import pytest
import torch

import diffusion_fuse
from diffusion_fuse import Options, parse_options
from diffusion_fuse.patterns.registry import REGISTRY


def test_defaults():
    opts = parse_options(None)
    assert opts == Options()
    assert opts.quality == "lossless" and opts.verify and opts.report is None


@pytest.mark.parametrize(
    "options, message",
    [
        ({"qualty": "high"}, "unknown option(s) ['qualty']; allowed options: ['atol', 'cudagraphs', 'patterns'"),
        ({"quality": "fast"}, "option quality='fast' is not allowed; allowed: ['lossless', 'high']"),
        ({"verify": "yes"}, "option verify='yes' is not allowed; allowed: [True, False]"),
        ({"patterns": {"no_such": True}},
         f"option patterns='no_such' is not allowed; allowed: {sorted(REGISTRY.names())}"),
        ({"patterns": {"norm_modulate": 1}}, "option patterns['norm_modulate']=1 is not allowed"),
        ({"report": 3}, "option report=3 is not allowed; allowed: a file path"),
        ({"rtol": -1}, "option rtol=-1 is not allowed"),
    ],
)
def test_bad_options_name_the_option_and_the_allowed_values(options, message):
    with pytest.raises(ValueError) as e:
        parse_options(options)
    assert message in str(e.value)


def test_bad_mode():
    with pytest.raises(ValueError, match="option mode='fastest' is not allowed; allowed: \\[None, 'default'"):
        parse_options(None, "fastest")


def test_bad_option_through_torch_compile_is_a_clear_error():
    m = torch.nn.Linear(4, 4)
    c = torch.compile(m, backend="diffusion_fuse", options={"quality": "exact"})
    with pytest.raises(Exception) as e:
        c(torch.randn(2, 4))
    assert "option quality='exact' is not allowed; allowed: ['lossless', 'high']" in str(e.value)


def test_families_are_enabled_and_disabled_separately():
    from helpers import bitwise_equal, compile_and_run

    from diffusion_fuse.testing.tiny_models import build

    model, kwargs = build("flux", torch.bfloat16)
    ref, out, report = compile_and_run(model, kwargs, {"patterns": {"gated_residual_norm_modulate": False}})
    assert bitwise_equal(ref, out)
    adaln = [s for s in report.sites() if s.pattern not in ("pointwise", "linear_cat", "grouped_gemv")]
    assert {s.pattern for s in adaln} == {"norm_modulate"} and len(adaln) == 6


def test_backend_found_by_name_through_the_entry_point():
    from torch._dynamo.backends.registry import lookup_backend

    assert lookup_backend("diffusion_fuse") is diffusion_fuse.diffusion_fuse


def test_disabling_the_family_leaves_the_graph_alone():
    from helpers import bitwise_equal, compile_and_run

    from diffusion_fuse.testing.tiny_models import build

    model, kwargs = build("flux", torch.bfloat16)
    ref, out, report = compile_and_run(
        model, kwargs, {"patterns": {"norm_modulate": False, "gated_residual_norm_modulate": False, "pointwise": False,
                                     "linear_cat": False, "grouped_gemv": False, "layer_norm": False}})
    assert bitwise_equal(ref, out)
    assert report.sites() == []


@pytest.mark.parametrize("mode", ["max-autotune-no-cudagraphs"])  # reduce-overhead: tests/test_cudagraphs.py
def test_modes_are_accepted(mode):
    from helpers import bitwise_equal

    from diffusion_fuse.testing.tiny_models import build

    model, kwargs = build("sana", torch.bfloat16)
    c = torch.compile(model, backend="diffusion_fuse", mode=mode)
    with torch.no_grad():
        assert bitwise_equal(model(**kwargs), c(**kwargs))


def test_report_option_writes_the_report(tmp_path):
    from diffusion_fuse.testing.tiny_models import build

    model, kwargs = build("flux", torch.bfloat16)
    for name in ("report.json", "report.txt"):
        path = tmp_path / name
        c = torch.compile(model, backend=diffusion_fuse.DiffusionFuseBackend({"report": str(path)}))
        with torch.no_grad():
            c(**kwargs)
        text = path.read_text()
        assert "norm_modulate@" in text
        torch._dynamo.reset()
    import json

    data = json.loads((tmp_path / "report.json").read_text())
    assert sum(s["pattern"] not in ("pointwise", "linear_cat", "grouped_gemv") for g in data["graphs"] for s in g["sites"].values()) == 6
