"""What the backend looks for: one module per pattern family, and the registry (registry.py).

A family module describes graph forms only: it names the op a match becomes through ``torch.ops.diffusion_fuse``
and imports nothing from lowering/ or kernels/. The family modules are imported from the family list
(diffusion_fuse/families.py).
"""

from .registry import REGISTRY, NearMiss, PatternFamily, Site, register_family  # noqa: F401
