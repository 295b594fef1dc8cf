"""What a match becomes: ``torch.library`` ops in namespace ``diffusion_fuse``.

Each op module holds the op, its fake impl, its reference impl (the original ATen chain),
its ``can_use_*`` guard and its dispatch to a Triton kernel. Importing this package
registers every op.
"""

from . import fp8_quant, gated_residual, grouped_gemv, linear_cat, linear_gelu, mean_square, norm_modulate, pointwise, rms_norm  # noqa: F401,E501  (register the ops)
