"""LongNetDecoder on variable-length batches, against each sequence alone
(float64, segments shorter than the sequences so every branch dilates):

- packed training input (``cu_seqlens``): each document's logits equal the
  document run alone (positions restart at 0 per document);
- prompts of different lengths (a list, or left/mixed padding with
  ``key_padding_mask``): each row's greedy tokens and every step's logits
  equal generating that prompt alone, with the KV cache and without it
  (where the context is cropped to each row's last max_seq_len tokens)."""

import random

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend

from dilcompile.models import LongNetConfig, LongNetDecoder

VOCAB = 23
CONFIG = dict(vocab_size=VOCAB, max_seq_len=32, embed_dim=24, num_heads=3, num_layers=2, segment_lengths=(4, 8, 16),
              dilation_rates=(1, 2, 4))
EXACT = dict(rtol=1e-10, atol=1e-10)


def _model(seed=0, **overrides):
    torch.manual_seed(seed)
    return LongNetDecoder(LongNetConfig(**(CONFIG | overrides))).double().eval()


def _random_lengths(rng, count, longest):
    lengths = [rng.randint(0, longest) for _ in range(count)]
    return lengths + [1, longest]  # always a one-token document and a full one


# -- packed documents (cu_seqlens) -----------------------------------------------------------------


@pytest.mark.parametrize("mode", ["longnet", "groups"])
@pytest.mark.parametrize("seed", range(3))
def test_packed_documents_give_each_documents_logits_alone(mode, seed):
    rng = random.Random(seed)
    model = _model(seed, mode=mode)
    lengths = _random_lengths(rng, 4, CONFIG["max_seq_len"])
    rng.shuffle(lengths)  # empty documents (length 0) are allowed, as in FlashAttention's varlen
    docs = [torch.randint(0, VOCAB, (n,)) for n in lengths]
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=rng.choice([torch.int32, torch.int64]))
    with torch.no_grad():
        packed, _ = model(torch.cat(docs)[None], cu_seqlens=cu)  # (1, total, vocab); total > max_seq_len
        for doc, start in zip(docs, cu[:-1].tolist()):
            if len(doc):
                alone, _ = model(doc[None])
                torch.testing.assert_close(packed[0, start : start + len(doc)], alone[0], **EXACT)


def test_packed_loss_and_gradients_equal_the_documents_alone():
    """Training on packed documents: the loss (each document's last target
    ignored) and the parameter gradients equal those of the padded-free
    per-document sum."""
    model = _model(1)
    docs = [torch.randint(0, VOCAB, (n,)) for n in (11, 1, 20)]
    cu = torch.tensor([0, 11, 12, 32])
    targets = torch.cat([torch.cat([d[1:], torch.tensor([-100])]) for d in docs])
    _, loss = model(torch.cat(docs)[None], targets[None], cu_seqlens=cu)
    got = torch.autograd.grad(loss, list(model.parameters()))
    logits = [model(d[None])[0][0, :-1] for d in docs if len(d) > 1]
    want_loss = torch.nn.functional.cross_entropy(torch.cat(logits), torch.cat([d[1:] for d in docs]))
    want = torch.autograd.grad(want_loss, list(model.parameters()))
    torch.testing.assert_close(loss, want_loss, **EXACT)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, **EXACT)


def test_packed_input_errors_name_the_argument():
    model = _model()
    idx = torch.zeros(1, 40, dtype=torch.long)
    with pytest.raises(ValueError, match="cu_seqlens has 33 tokens, more than max_seq_len"):
        model(idx, cu_seqlens=torch.tensor([0, 7, 40]))
    with pytest.raises(ValueError, match="cu_seqlens must start at 0"):
        model(idx, cu_seqlens=torch.tensor([2, 40]))
    with pytest.raises(TypeError, match="cu_seqlens"):
        model(idx, cu_seqlens=[0, 40])
    with pytest.raises(ValueError, match="cu_seqlens and cache"):
        model(idx[:, :8], cu_seqlens=torch.tensor([0, 8]), cache=model.new_cache(1))
    with pytest.raises(ValueError, match="not both"):
        model(idx[:, :8], cu_seqlens=torch.tensor([0, 8]), key_padding_mask=torch.zeros(1, 8, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"\(1, total\)"):
        model(torch.zeros(2, 8, dtype=torch.long), cu_seqlens=torch.tensor([0, 8]))


# -- prompts of different lengths ------------------------------------------------------------------


def _stepwise_logits(model, tokens, prompt_len, mask=None):
    """Logits of every position: the prompt in one cached call, then one token per call."""
    cache = model.new_cache(tokens.shape[0], tokens.shape[1])
    pads = {} if mask is None else {"key_padding_mask": mask[:, :prompt_len]}
    logits = [model(tokens[:, :prompt_len], cache=cache, **pads)[0]]
    for pos in range(prompt_len, tokens.shape[1]):
        pads = {} if mask is None else {"key_padding_mask": mask[:, : pos + 1]}
        logits.append(model(tokens[:, pos : pos + 1], cache=cache, start_pos=pos, **pads)[0])
    return torch.cat(logits, 1)


@pytest.mark.parametrize("seed", range(3))
def test_a_batch_of_prompts_generates_each_prompts_greedy_tokens_and_logits_alone(seed):
    rng = random.Random(seed)
    model = _model(seed)
    new = 7
    lengths = [rng.randint(1, 32 - new) for _ in range(3)] + [1, 32 - new]  # the longest fills max_seq_len
    prompts = [torch.randint(0, VOCAB, (n,)) for n in lengths]
    alone = [model.generate(p[None], new, temperature=0)[0] for p in prompts]
    got = model.generate(prompts, new, temperature=0)  # a list in, a list out
    for g, a, p in zip(got, alone, prompts):
        assert torch.equal(g, a) and torch.equal(g[: len(p)], p)
    # The same batch left-padded with its mask; the pads' ids are ignored.
    width = max(lengths)
    idx = torch.stack([torch.cat([torch.full((width - len(p),), -5), p]) for p in prompts])
    mask = torch.stack([torch.arange(width) < width - len(p) for p in prompts])
    out = model.generate(idx, new, temperature=0, key_padding_mask=mask)
    for row, a, p in zip(out, alone, prompts):
        assert torch.equal(row[width - len(p) :], a)
    # Right-padded: the pads lie between each prompt and its new tokens.
    idx = torch.stack([torch.cat([p, torch.full((width - len(p),), -5)]) for p in prompts])
    right = torch.stack([torch.arange(width) >= len(p) for p in prompts])
    for use_cache in (True, False):
        out_right = model.generate(idx, new, temperature=0, key_padding_mask=right, use_cache=use_cache)
        for row, m, a in zip(out_right, right, alone):
            assert torch.equal(row[torch.cat([~m, torch.ones(new, dtype=torch.bool)])], a)
    # And every step's logits, not only their argmax.
    full_mask = torch.cat([mask, torch.zeros(len(prompts), new, dtype=torch.bool)], 1)
    with torch.no_grad():
        batched = _stepwise_logits(model, out, width, full_mask)
        for b, (a, p) in enumerate(zip(alone, prompts)):
            want = _stepwise_logits(model, a[None], len(p))[0]
            torch.testing.assert_close(batched[b, ~full_mask[b]], want, **EXACT)


def test_mixed_padding_forward_equals_each_row_alone():
    """Pads anywhere (before, between and after the real tokens) are absent."""
    model = _model(3)
    torch.manual_seed(3)
    idx = torch.randint(0, VOCAB, (3, 30))
    mask = torch.rand(3, 30) < 0.3
    mask[2] = False
    mask[1, :4] = mask[1, -3:] = True
    with torch.no_grad():
        got, _ = model(idx, key_padding_mask=mask)
        for b in range(3):
            want, _ = model(idx[b, ~mask[b]][None])
            torch.testing.assert_close(got[b, ~mask[b]], want[0], **EXACT)


def test_generation_past_max_seq_len_crops_each_row_to_its_own_last_tokens():
    """Without the cache (prompt + new > max_seq_len) every step recomputes each
    row's last max_seq_len real tokens: the rows still equal their prompts alone."""
    model = _model(4)
    prompts = [torch.randint(0, VOCAB, (n,)) for n in (30, 12, 1)]
    alone = [model.generate(p[None], 9, temperature=0, use_cache=False)[0] for p in prompts]
    got = model.generate(prompts, 9, temperature=0)  # left-padded: each row's last tokens are the last columns
    assert all(torch.equal(g, a) for g, a in zip(got, alone))
    # Right-padded, the pads lie between a row's prompt and its new tokens: the
    # crop keeps each row's own last max_seq_len real tokens, not the last columns
    # (and drops the leading column, a pad in every row).
    idx = torch.stack([torch.cat([p.new_zeros(1), p, p.new_zeros(30 - len(p))]) for p in prompts])
    mask = torch.stack([(torch.arange(31) == 0) | (torch.arange(31) > len(p)) for p in prompts])
    out = model.generate(idx, 9, temperature=0, key_padding_mask=mask)
    for row, m, a in zip(out, mask, alone):
        assert torch.equal(row[torch.cat([~m, torch.ones(9, dtype=torch.bool)])], a)
    with pytest.raises(ValueError, match="use_cache=False"):  # the longest row decides
        model.generate(prompts, 9, use_cache=True)


def test_sampling_a_batch_of_prompts_returns_each_prompt_and_new_tokens():
    model = _model(5)
    prompts = [torch.randint(0, VOCAB, (n,)) for n in (6, 2)]
    got = model.generate(prompts, 4, top_k=5, generator=torch.Generator().manual_seed(0))
    assert [len(g) for g in got] == [10, 6]
    assert all(torch.equal(g[: len(p)], p) and g.min() >= 0 and g.max() < VOCAB for g, p in zip(got, prompts))


def test_compiled_batched_generation_equals_eager_and_does_not_recompile_per_token():
    torch._dynamo.reset()
    model = _model(6, num_layers=1)
    prompts = [torch.randint(0, VOCAB, (n,)) for n in (9, 3)]
    counter = CompileCounterWithBackend("inductor")
    compiled = torch.compile(model, fullgraph=True, dynamic=True, backend=counter)
    want = model.generate(prompts, 8, temperature=0)
    got = model.generate(prompts, 8, temperature=0, forward=compiled)
    assert all(torch.equal(g, w) for g, w in zip(got, want))
    frames = counter.frame_count
    model.generate([torch.randint(0, VOCAB, (n,)) for n in (4, 11)], 12, temperature=0, forward=compiled)
    assert counter.frame_count == frames, "a longer batched generation compiled again"
    torch._dynamo.reset()


def test_compiled_packed_forward_fullgraph_equals_eager():
    torch._dynamo.reset()
    model = _model(7, num_layers=1)
    idx, cu = torch.randint(0, VOCAB, (1, 40)), torch.tensor([0, 13, 14, 40])
    compiled = torch.compile(model, fullgraph=True)
    with torch.no_grad():
        torch.testing.assert_close(compiled(idx, cu_seqlens=cu)[0], model(idx, cu_seqlens=cu)[0], **EXACT)
    torch._dynamo.reset()


def test_a_padded_batch_may_be_wider_than_max_seq_len_but_a_row_may_not_be_longer():
    model = _model(8)
    idx = torch.randint(0, VOCAB, (2, 40))
    mask = torch.arange(40)[None, :].expand(2, 40) < torch.tensor([[10], [8]])  # rows of 30 and 32 real tokens
    with torch.no_grad():
        got, _ = model(idx, key_padding_mask=mask)
        want, _ = model(idx[1:, 8:])
    torch.testing.assert_close(got[1, 8:], want[0], **EXACT)
    with pytest.raises(ValueError, match="key_padding_mask holds more than max_seq_len=32"):
        model(idx, key_padding_mask=mask & (torch.arange(40) < 7))
