"""Tags of our custom ops that the compiler acts on.

``HOST_READS``: the op reads tensor values on the host while it runs (the
variable-length ops read their metadata, block-sparse attention checks its
inputs for non-finite values, the masked references check theirs). A CUDA
graph cannot capture a host read, so Inductor keeps a graph holding such an
op out of CUDA graphs (``mode="reduce-overhead"``, which transformers'
compiled ``generate`` uses on CUDA) instead of failing at capture. Empty on
a torch without the tag."""

from __future__ import annotations

import torch

HOST_READS = tuple(tag for tag in (getattr(torch.Tag, "cudagraph_unsafe", None),) if tag is not None)
