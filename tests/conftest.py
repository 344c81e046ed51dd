import os

import pytest
import torch

# Two cores: keep intra-op threads from oversubscribing when pytest-xdist is used.
torch.set_num_threads(max(1, min(torch.get_num_threads(), int(os.environ.get("DILCOMPILE_TEST_THREADS", "2")))))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(1234)
