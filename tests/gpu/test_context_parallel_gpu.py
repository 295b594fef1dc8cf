"""diffusion_fuse under diffusers' context parallelism on 2 GPUs (NCCL), the Triton kernels live.

    python -m pytest -q tests/gpu/test_context_parallel_gpu.py        # a host with 2 GPUs

Tiny FLUX and Wan in bf16, Ulysses degree 2 (diffusers' native attention), and FLUX with ring degree 2
(``_native_flash``, which returns the log-sum-exp ring attention merges with): every call on every rank bitwise
equal to eager with the same parallel config, kernels hit, the collectives of the graph that runs those of the
traced graph, the verifier's decisions the same on both ranks (also when rank 0 alone rejects a site), and the same
under CUDA graphs
(``options={"cudagraphs": True}``, NCCL collectives captured).
"""

import pytest
import torch

if torch.cuda.device_count() < 2:
    pytest.skip("needs 2 CUDA devices", allow_module_level=True)

from diffusion_fuse.testing import context_parallel  # noqa: E402

SCENARIOS = ("plain", "site_rejected", "cudagraphs")


ULYSSES2, RING2 = (2, 1, None), (1, 2, "_native_flash")


# Ring on FLUX only: the tiny Wan's head dim (12) is not one flash attention takes.
@pytest.mark.parametrize(("name", "degrees"), [("flux", ULYSSES2), ("wan21", ULYSSES2), ("flux", RING2)],
                         ids=["flux-ulysses2", "wan21-ulysses2", "flux-ring2"])
def test_context_parallel_compiled_equals_eager_cp(name, degrees):
    ulysses, ring, attention = degrees
    ranks = context_parallel.spawn(
        context_parallel.compiled_vs_eager, 2, name, "bfloat16", ulysses, ring, SCENARIOS, "norm_modulate", 0, 3,
        name != "wan21", "cuda", attention, device="cuda", timeout=600)
    for scenario in SCENARIOS:
        a, b = (r["scenarios"][scenario] for r in ranks)
        for r in (a, b):
            assert all(r["equal"]), (scenario, r["equal"], r["notes"])
            assert all(r["agreed"]) and r["collectives_final"] == r["collectives_ref"], scenario
            assert any(r["collectives_ref"]), scenario
            assert sum(r["kernels"].values()) > 0, (scenario, r["kernels"])
        assert {k: v[0] for k, v in a["sites"].items()} == {k: v[0] for k, v in b["sites"].items()}, scenario
        assert a["final_ops"] == b["final_ops"], scenario
        if scenario == "plain":
            assert {v[0] for v in a["sites"].values()} == {"kept"}, a["sites"]
        if scenario == "site_rejected":
            rejected = {k for k, v in b["sites"].items() if v[1] == "rejected on rank(s) [0]"}
            assert rejected and all(k.startswith("norm_modulate@") for k in rejected)
        if scenario == "cudagraphs":
            assert all(c.startswith("on") for c in a["cudagraphs"]), a["cudagraphs"]
    print(name, degrees, "CP eager vs one-GPU eager:",
          [(r["cp_equals_single"], r["cp_vs_single_max_abs"]) for r in ranks])
