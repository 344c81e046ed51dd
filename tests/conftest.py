import os

import pytest
import torch

# Triton picks its CPU interpreter when it decorates kernels (at first import,
# which importing torch does not do): without a GPU, impl="triton" runs interpreted.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Two cores: keep intra-op threads from oversubscribing when pytest-xdist is used.
torch.set_num_threads(max(1, min(torch.get_num_threads(), int(os.environ.get("DILCOMPILE_TEST_THREADS", "2")))))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(1234)
