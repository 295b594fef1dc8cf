"""Graph rewrites: one registered pass per module (``base.register_pass``), run in order by ``PassManager``
(pass_manager.py). Beside them: ``base`` (the pass class and shared matcher helpers), ``inductor_pass`` (the
pipeline inside Inductor, tier high), and the runtime rewrites ``recompose_linear``, ``python_bindings`` and
``direct_calls``, which ``PassManager.runtime`` applies to the graph the verifier chose."""

from .base import GraphPass, PassContext  # noqa: F401
from .pass_manager import PassManager  # noqa: F401
