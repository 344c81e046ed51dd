"""LongNetDecoder.generate and forward: every bad argument is one ValueError
or TypeError naming that argument, raised before any compute; randomized
valid arguments work and keep their documented meaning (max_new_tokens=0
returns the prompt, top_k ≥ vocab_size filters nothing, top_k=1 is greedy)."""

import math
import random

import pytest
import torch

from dilcompile.models import LongNetConfig, LongNetDecoder

VOCAB = 19
SMALL = dict(vocab_size=VOCAB, max_seq_len=32, embed_dim=16, num_heads=2, num_layers=1, segment_lengths=(4, 8),
             dilation_rates=(1, 2))
HUGE = (2**63, 10**30)

# Bad values of each kind per argument, with the error each one gets.
BAD = {
    "max_new_tokens": [(-3, ValueError), (-1, ValueError), (2.0, TypeError), (True, TypeError), (False, TypeError),
                       (math.nan, TypeError), (math.inf, TypeError), (None, TypeError), ("3", TypeError)]
                      + [(h, ValueError) for h in HUGE] + [(-h, ValueError) for h in HUGE],
    "temperature": [(-1.0, ValueError), (-1e-9, ValueError), (math.nan, ValueError), (math.inf, ValueError),
                    (-math.inf, ValueError), (True, TypeError), (None, TypeError), ("1", TypeError)],
    "top_k": [(0, ValueError), (-1, ValueError), (-(10**30), ValueError), (2.0, TypeError), (True, TypeError),
              (math.nan, TypeError), (math.inf, TypeError), ("5", TypeError)],
    "generator": [(0, TypeError), ("seed", TypeError)],
    "use_cache": [(1, TypeError), (0, TypeError), ("yes", TypeError)],
    "forward": [(1, TypeError), ("model", TypeError)],
}
# Valid values; None of top_k is "no top-k filter".
VALID = {
    "max_new_tokens": [0, 1, 2, 5],
    "temperature": [0, 0.0, 1, 0.7, 1e-3, 1e6],
    "top_k": [None, 1, 3, VOCAB, VOCAB + 1, *HUGE],
    "use_cache": [None, True, False],
}


def _model():
    torch.manual_seed(0)
    return LongNetDecoder(LongNetConfig(**SMALL)).eval()


def _valid_kwargs(rng):
    return {name: rng.choice(values) for name, values in VALID.items()}


def test_randomized_bad_generate_arguments_raise_naming_the_argument():
    model, rng = _model(), random.Random(0)
    prompt = torch.randint(0, VOCAB, (2, 3))
    cases = [(name, value, error) for name, values in BAD.items() for value, error in values]
    for name, value, error in cases + rng.sample(cases, 20):  # every case, then again with other valid arguments
        kwargs = _valid_kwargs(rng) | {name: value}
        with pytest.raises(error, match=name):
            model.generate(prompt, **kwargs)


@pytest.mark.parametrize("idx, mask, error, match", [
    (torch.zeros(2, 0, dtype=torch.long), None, ValueError, "idx"),  # an empty prompt
    (torch.zeros(0, 3, dtype=torch.long), None, ValueError, "idx"),  # no rows
    (torch.zeros(3, dtype=torch.long), None, ValueError, "idx"),  # 1-D: pass a list, or idx[None]
    (torch.zeros(2, 3), None, TypeError, "idx"),
    (torch.zeros(2, 3, dtype=torch.bool), None, TypeError, "idx"),
    (torch.zeros(2, 3, dtype=torch.uint8), None, TypeError, r"idx\.long\(\)"),  # nn.Embedding takes int64, int32
    (torch.zeros(2, 3, dtype=torch.int16), None, TypeError, r"idx\.long\(\)"),
    ([[1, 2, 3]], None, TypeError, "idx"),
    ("abc", None, TypeError, "idx"),
    (torch.tensor([[1, VOCAB]]), None, ValueError, "idx holds token ids"),
    (torch.tensor([[-1, 2]]), None, ValueError, "idx holds token ids"),
    ([], None, ValueError, "idx"),
    ([torch.tensor([1, 2]), torch.tensor([], dtype=torch.long)], None, ValueError, "idx"),
    ([torch.tensor([1, 2]), torch.tensor([[3]])], None, TypeError, "idx"),
    ([torch.tensor([1, 2]), torch.tensor([3], dtype=torch.int32)], None, ValueError, "idx"),
    ([torch.tensor([1, 2])], torch.tensor([[False, False]]), ValueError, "key_padding_mask"),
    (torch.tensor([[1, 2], [3, 4]]), torch.tensor([[True, False], [True, True]]), ValueError, "key_padding_mask"),
    (torch.tensor([[1, 2], [3, 4]]), torch.tensor([[False, False]]), ValueError, "key_padding_mask"),
    (torch.tensor([[1, 2], [3, 4]]), torch.zeros(2, 2), TypeError, "key_padding_mask"),
])
def test_bad_prompts_raise_naming_the_argument(idx, mask, error, match):
    with pytest.raises(error, match=match):
        _model().generate(idx, 2, key_padding_mask=mask)


def test_pads_may_hold_any_id():
    """The ids at pads are never read: an out-of-vocabulary pad id is fine."""
    model = _model()
    idx, mask = torch.tensor([[-1, 5, 6], [4, 5, 6]]), torch.tensor([[True, False, False], [False, False, False]])
    got = model.generate(idx, 3, temperature=0, key_padding_mask=mask)
    want = model.generate(idx[1:, 1:], 3, temperature=0)
    assert torch.equal(got[0, 1:], want[0])


@pytest.mark.parametrize("start_pos, error", [(1.0, TypeError), (True, TypeError), (math.nan, TypeError),
                                              (-1, ValueError), (2**64, ValueError), (None, TypeError)])
def test_bad_start_pos_raises_naming_it(start_pos, error):
    model = _model()
    with pytest.raises(error, match="start_pos"):
        model(torch.zeros(1, 2, dtype=torch.long), cache=model.new_cache(1), start_pos=start_pos)


def test_bad_forward_inputs_raise_naming_the_argument():
    model = _model()
    bad = ((torch.zeros(1, 2), TypeError), (torch.zeros(2, dtype=torch.long), ValueError), ([[1]], TypeError),
           (torch.zeros(1, 2, dtype=torch.int8), TypeError))
    for idx, error in bad:
        with pytest.raises(error, match="idx"):
            model(idx)
    with pytest.raises(TypeError, match="cache"):
        model(torch.zeros(1, 2, dtype=torch.long), cache=object())
    assert model(torch.zeros(1, 2, dtype=torch.int32))[0].shape == (1, 2, VOCAB)  # int32 ids index too


def test_randomized_valid_generate_arguments_work_and_keep_their_meaning():
    model, rng = _model(), random.Random(1)
    for trial in range(24):
        kwargs = _valid_kwargs(rng)
        batch, n0 = rng.randint(1, 3), rng.randint(1, 6)
        if kwargs["use_cache"] is True:  # positions are absolute: the cache needs prompt + new ≤ max_seq_len
            n0 = min(n0, SMALL["max_seq_len"] - kwargs["max_new_tokens"])
        prompt = torch.randint(0, VOCAB, (batch, n0))
        seed = rng.randrange(2**31)
        out = model.generate(prompt, generator=torch.Generator().manual_seed(seed), **kwargs)
        assert out.shape == (batch, n0 + kwargs["max_new_tokens"]), (trial, kwargs)
        assert torch.equal(out[:, :n0], prompt) and out.min() >= 0 and out.max() < VOCAB, (trial, kwargs)
        top_k = kwargs["top_k"]
        if top_k is not None and top_k >= VOCAB:  # documented: keeps every token, the same draws as no top_k
            same = model.generate(prompt, generator=torch.Generator().manual_seed(seed), **(kwargs | {"top_k": None}))
            assert torch.equal(out, same), (trial, kwargs)
        if top_k == 1 or kwargs["temperature"] == 0:  # both are greedy
            greedy = model.generate(prompt, **(kwargs | {"temperature": 0, "top_k": None}))
            assert torch.equal(out, greedy), (trial, kwargs)
    out = model.generate(prompt, 0)
    assert torch.equal(out, prompt) and out.data_ptr() != prompt.data_ptr()  # a copy, never the input itself
