"""Dense softmax-attention kernels that also return the row log-sum-exp."""

import importlib.util

from .attention import attention_backward, attention_forward, backend_for

# Whether the fused Triton kernels can be imported (the [triton] extra); nothing imports triton here.
HAS_TRITON = importlib.util.find_spec("triton") is not None

__all__ = ["HAS_TRITON", "attention_backward", "attention_forward", "backend_for"]
