"""Dense softmax-attention kernels that also return the row log-sum-exp."""

from .attention import attention_backward, attention_forward, backend_for

__all__ = ["attention_backward", "attention_forward", "backend_for"]
