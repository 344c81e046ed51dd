"""The LongNet decoder: compiled (fullgraph) loss == eager loss, a few
training steps reduce the loss, sampling, config round-trip."""

import pytest
import torch
from torch._dynamo.utils import counters

from dilcompile.models import LongNetConfig, LongNetDecoder

SMALL = dict(vocab_size=19, max_seq_len=64, embed_dim=32, num_heads=4, num_layers=2, segment_lengths=(16, 32, 64),
             dilation_rates=(1, 2, 4))


def test_compiled_model_fullgraph_loss_equals_eager():
    # Compiled gradients are checked on the module (test_multihead) and by scripts/train_tiny.py;
    # here the whole model's graph.
    torch._dynamo.reset()
    counters.clear()
    model = LongNetDecoder(LongNetConfig(**(SMALL | {"num_layers": 1})))  # one block keeps the compile short
    idx = torch.randint(0, 19, (2, 50))
    targets = torch.randint(0, 19, (2, 50))
    compiled = torch.compile(model, fullgraph=True)
    with torch.no_grad():  # an inference graph only: half the Inductor work of a training graph
        _, loss = compiled(idx, targets)
        _, want = model(idx, targets)
    torch.testing.assert_close(loss, want, rtol=1e-5, atol=1e-5)
    assert not counters["graph_break"], dict(counters["graph_break"])
    torch._dynamo.reset()


def test_a_few_training_steps_reduce_the_loss():
    torch.manual_seed(0)
    model = LongNetDecoder(LongNetConfig(**SMALL))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    pattern = torch.arange(64) % 7  # a periodic sequence: learnable through the causal dilated branches
    idx, targets = pattern[None, :-1].repeat(4, 1), pattern[None, 1:].repeat(4, 1)
    losses = []
    for _ in range(25):
        _, loss = model(idx, targets)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0], losses


def test_generate_and_config():
    model = LongNetDecoder(LongNetConfig(**SMALL)).eval()
    out = model.generate(torch.zeros(2, 3, dtype=torch.long), 70, top_k=5)  # runs past max_seq_len: cropped
    assert out.shape == (2, 73) and out.min() >= 0 and out.max() < 19
    cfg = LongNetConfig(**SMALL)
    assert LongNetConfig.from_json(cfg.to_json()) == cfg
    with pytest.raises(ValueError, match="max_seq_len"):
        model(torch.zeros(1, 65, dtype=torch.long))
    with pytest.raises(ValueError, match="divisible"):
        LongNetConfig(**(SMALL | {"num_heads": 5}))
