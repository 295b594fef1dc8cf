"""What a match becomes: ``torch.library`` ops in namespace ``diffusion_fuse``.

One module per family declares its op(s) with an ``OpSpec`` (spec.py): the reference (the ATen composition
the op replaces, whose signature is the schema), the ``can_use_*`` guard, the plan that launches the family's
kernel, and the registration generated from them. ``dispatch.GuardedKernel`` runs the kernel for the layouts
the guard accepts and the reference for the rest. The family modules are imported from the family list
(diffusion_fuse/families.py).
"""
