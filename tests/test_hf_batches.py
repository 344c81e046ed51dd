"""Hugging Face integration, variable-length batches: a padded batch, batched
``generate`` and packed rows give every sequence exactly what it gets alone,
with real dilation / sparsity (segments shorter than the sequences), eager and
under ``torch.compile(fullgraph=True)``. Tiny random models built from
configs (no downloads), float64, randomized lengths."""

import itertools

import pytest
import torch
from transformers import DataCollatorWithFlattening

from dilcompile.integrations.transformers import configure, register
from helpers import tiny_config, tiny_model

register()

IMPLS = ("dilcompile_dilated", "dilcompile_block_sparse")
VOCAB = 61
# Positions matter to both: dilation offsets / segment grid, and global tokens + a dilated block pattern.
SETTINGS = {"segment_lengths": [4, 8], "dilation_rates": [1, 2], "block_size": 4,
            "pattern": "union(global_local(window=3, global_tokens=2), dilated(segment_lengths=(8,), "
                       "dilation_rates=(2,)))"}


def _llama(impl, **extra):
    return tiny_model(impl, configure(tiny_config(vocab=VOCAB, **extra), **SETTINGS))


def _lengths(seed, count, low, high):
    return torch.randint(low, high + 1, (count,), generator=torch.Generator().manual_seed(seed)).tolist()


def _tokens(seed, length):
    return torch.randint(1, VOCAB, (length,), generator=torch.Generator().manual_seed(1000 + seed))


def _padded(seqs, side):
    """(B, N) ids and mask; ``side`` "left", "right" or "mixed" (pads on both sides of a row)."""
    n = max(len(s) for s in seqs) + 3
    ids, mask = torch.zeros(len(seqs), n, dtype=torch.long), torch.zeros(len(seqs), n, dtype=torch.long)
    for b, s in enumerate(seqs):
        start = {"left": n - len(s), "right": 0, "mixed": (n - len(s)) // 2}[side]
        ids[b, start : start + len(s)], mask[b, start : start + len(s)] = s, 1
    return ids, mask


def _positions(mask):
    """What generate passes: each row's positions count from its first real token."""
    return (mask.cumsum(-1) - 1).clamp(min=0)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("side, seed", [("left", 0), ("right", 1), ("mixed", 2)])
def test_padded_batch_equals_each_sequence_alone(impl, side, seed):
    model = _llama(impl)
    seqs = [_tokens(seed * 10 + i, n) for i, n in enumerate(_lengths(seed, 4, 5, 23))]
    ids, mask = _padded(seqs, side)
    logits = model(ids, attention_mask=mask, position_ids=_positions(mask)).logits
    for b, s in enumerate(seqs):
        alone = model(s[None]).logits[0]
        torch.testing.assert_close(logits[b][mask[b].bool()], alone, rtol=1e-10, atol=1e-10, msg=f"row {b}")


@pytest.mark.parametrize("impl", IMPLS)
def test_batched_generate_equals_each_prompt_alone(impl):
    model = _llama(impl)
    prompts = [_tokens(20 + i, n) for i, n in enumerate(_lengths(7, 3, 6, 17))]
    ids, mask = _padded(prompts, "left")
    kw = {"max_new_tokens": 10, "min_new_tokens": 10, "do_sample": False, "pad_token_id": 0}
    batched = model.generate(ids, attention_mask=mask, **kw)[:, ids.shape[1]:]
    batched_logits = model.generate(ids, attention_mask=mask, output_logits=True, return_dict_in_generate=True,
                                    **kw).logits
    for b, p in enumerate(prompts):
        alone = model.generate(p[None], output_logits=True, return_dict_in_generate=True, **kw)
        assert torch.equal(batched[b], alone.sequences[0, len(p):]), f"prompt {b}"
        for step, (got, want) in enumerate(zip(batched_logits, alone.logits)):
            torch.testing.assert_close(got[b], want[0], rtol=1e-10, atol=1e-10, msg=f"prompt {b} step {step}")


def _documents(seed, count=3):
    return [_tokens(40 + seed * 10 + i, n) for i, n in enumerate(_lengths(seed, count, 3, 14))]


def _check_documents(logits_row, docs, model):
    start = 0
    for i, d in enumerate(docs):
        alone = model(d[None]).logits[0]
        torch.testing.assert_close(logits_row[start : start + len(d)], alone, rtol=1e-10, atol=1e-10,
                                   msg=f"document {i}")
        start += len(d)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("use_cache", [False, True])
def test_packed_row_from_position_ids_equals_each_document_alone(impl, use_cache):
    """position_ids restarting at 0 separate the documents, with the cache (where transformers does not
    look for packing) or without (where it does)."""
    model = _llama(impl)
    docs = _documents(3 + use_cache)
    ids = torch.cat(docs)[None]
    position_ids = torch.cat([torch.arange(len(d)) for d in docs])[None]
    logits = model(ids, position_ids=position_ids, use_cache=use_cache).logits
    _check_documents(logits[0], docs, model)


@pytest.mark.parametrize("impl", IMPLS)
def test_two_packed_rows_equal_each_document_alone(impl):
    model = _llama(impl)
    n, rows = 24, []
    for seed in (5, 6):  # each row: 24 tokens cut into documents at random points
        g = torch.Generator().manual_seed(seed)
        cuts = [0] + sorted(torch.randperm(n - 1, generator=g)[: 1 + seed % 3].add(1).tolist()) + [n]
        tokens = _tokens(seed, n)
        rows.append([tokens[a:b] for a, b in itertools.pairwise(cuts)])
    ids = torch.stack([torch.cat(row) for row in rows])
    position_ids = torch.stack([torch.cat([torch.arange(len(d)) for d in row]) for row in rows])
    logits = model(ids, position_ids=position_ids, use_cache=False).logits
    for b, row in enumerate(rows):
        _check_documents(logits[b], row, model)


@pytest.mark.parametrize("impl", IMPLS)
def test_flattening_collator_equals_each_document_alone(impl):
    """DataCollatorWithFlattening's cu_seq_lens_q/k, max_length_q/k keywords reach the attention."""
    model = _llama(impl)
    docs = _documents(8, count=4)
    batch = DataCollatorWithFlattening(return_flash_attn_kwargs=True)([{"input_ids": d.tolist()} for d in docs])
    assert "cu_seq_lens_q" in batch
    logits = model(**batch, use_cache=False).logits
    _check_documents(logits[0], docs, model)
    out = model(**batch, use_cache=False)  # labels: a finite training loss
    assert out.loss.isfinite()


def test_packing_keywords_with_a_padding_mask_are_refused():
    model = _llama("dilcompile_dilated")
    batch = DataCollatorWithFlattening(return_flash_attn_kwargs=True)([{"input_ids": [1, 2, 3]}, {"input_ids": [4]}])
    with pytest.raises(ValueError, match="cu_seq_lens_q"):
        model(**batch, attention_mask=torch.ones_like(batch["input_ids"]), use_cache=False)


@pytest.mark.parametrize("impl", IMPLS)
def test_compiles_fullgraph_with_padding_mask_and_packing(impl):
    """fullgraph=True: no host sync in the attention path. Compiled equals eager, outputs and weight
    gradients, with a padding mask (one graph for every pad pattern of a shape, none included) and with
    packed rows (position_ids). aot_eager runs the captured graph op by op, so it is exact (inductor:
    the next test)."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    model = _llama(impl, use_cache=False)
    compiled = torch.compile(model, fullgraph=True, dynamic=False, backend="aot_eager")
    for seed in (0, 1, 2):
        seqs = [_tokens(60 + seed * 10 + i, n) for i, n in enumerate([17] + _lengths(seed, 2, 4, 17))]
        ids, mask = _padded(seqs, "left")
        if seed == 2:
            mask = torch.ones_like(mask)  # no padding: the batched path, chosen at run time
        eager = model(ids, attention_mask=mask).logits
        got = compiled(ids, attention_mask=mask).logits
        torch.testing.assert_close(got, eager, rtol=1e-10, atol=1e-10)
        if seed == 0:
            graphs = counters["stats"]["unique_graphs"]
            want = torch.autograd.grad(eager.sum(), list(model.parameters()))
            for g, w in zip(torch.autograd.grad(got.sum(), list(model.parameters())), want):
                torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-10)
    assert counters["stats"]["unique_graphs"] == graphs, "a new pad pattern recompiled"
    docs = [d[:6] for d in _documents(9)] + [_tokens(99, 2)]
    ids = torch.cat(docs)[None]
    position_ids = torch.cat([torch.arange(len(d)) for d in docs])[None]
    got = compiled(ids, position_ids=position_ids).logits
    torch.testing.assert_close(got, model(ids, position_ids=position_ids).logits, rtol=1e-10, atol=1e-10)
    _check_documents(got[0], docs, model)
    # No mask, positions 0..N-1 (transformers still composes its packed-rows mask under tracing): batched path.
    torch.testing.assert_close(compiled(ids).logits, model(ids).logits, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("impl, scaling", [("dilcompile_dilated", "usual"), ("dilcompile_block_sparse", 0.3)])
def test_compiles_fullgraph_with_dynamic_shapes(impl, scaling):
    """dynamic=True keeps the attention modules' float ``scaling`` symbolic, and torch.cond takes no float
    operand (it failed to trace): the usual head_dim ** -0.5 is matched to a constant, another scale is
    folded into q. Compiled equals eager over batch sizes, lengths, padding and packing."""
    torch._dynamo.reset()
    model = _llama(impl, use_cache=False)
    if scaling != "usual":
        for layer in model.model.layers:
            layer.self_attn.scaling = scaling
    compiled = torch.compile(model, fullgraph=True, dynamic=True, backend="aot_eager")
    for seed, (batch, longest) in enumerate([(2, 11), (3, 17)]):
        seqs = [_tokens(80 + seed * 10 + i, n) for i, n in enumerate([longest] + _lengths(seed, 2, batch, longest))]
        ids, mask = _padded(seqs, "left")
        torch.testing.assert_close(compiled(ids, attention_mask=mask).logits, model(ids, attention_mask=mask).logits,
                                   rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(compiled(ids).logits, model(ids).logits, rtol=1e-10, atol=1e-10)
    docs = [d[:6] for d in _documents(9)] + [_tokens(99, 2)]
    ids, position_ids = torch.cat(docs)[None], torch.cat([torch.arange(len(d)) for d in docs])[None]
    torch.testing.assert_close(compiled(ids, position_ids=position_ids).logits,
                               model(ids, position_ids=position_ids).logits, rtol=1e-10, atol=1e-10)


def test_inductor_with_padding_mask_errs_no_more_than_sdpa():
    """Inductor, fullgraph: Llama's rotary tables are float32 and inductor rounds them differently from
    eager (sdpa's logits move by ~4e-8 too); ours may move no more than 2 × sdpa's (+ float64 noise)."""
    seqs = [_tokens(70 + i, n) for i, n in enumerate([17] + _lengths(13, 2, 4, 17))]
    ids, mask = _padded(seqs, "left")
    real = mask.bool()
    moved = {}
    for impl in ("sdpa", "dilcompile_dilated"):
        torch._dynamo.reset()
        model = _llama(impl, use_cache=False)
        eager = model(ids, attention_mask=mask).logits
        got = torch.compile(model, fullgraph=True, dynamic=False)(ids, attention_mask=mask).logits
        moved[impl] = (got - eager)[real].abs().max().item()
    assert moved["dilcompile_dilated"] <= 2 * moved["sdpa"] + 1e-12, moved


def _bert(impl):
    return tiny_model(impl, configure(tiny_config("bert", vocab=VOCAB, positions=64), **SETTINGS))


@pytest.mark.parametrize("impl", IMPLS)
def test_encoder_padded_batch_equals_each_sequence_alone(impl):
    """Bidirectional (BERT-style): right padding, as tokenizers pad, with real dilation / sparsity."""
    model = _bert(impl)
    seqs = [_tokens(80 + i, n) for i, n in enumerate(_lengths(11, 4, 5, 30))]
    ids, mask = _padded(seqs, "right")
    hidden = model(ids, attention_mask=mask).last_hidden_state
    for b, s in enumerate(seqs):
        alone = model(s[None]).last_hidden_state[0]
        torch.testing.assert_close(hidden[b, : len(s)], alone, rtol=1e-10, atol=1e-10, msg=f"row {b}")


def test_encoder_with_covering_segment_equals_sdpa():
    model = _bert("dilcompile_dilated")
    configure(model, segment_lengths=[64], dilation_rates=[1])
    sdpa = _bert("sdpa")
    seqs = [_tokens(90 + i, n) for i, n in enumerate(_lengths(12, 3, 5, 30))]
    ids, mask = _padded(seqs, "right")
    got, want = model(ids, attention_mask=mask).last_hidden_state, sdpa(ids, attention_mask=mask).last_hidden_state
    torch.testing.assert_close(got[mask.bool()], want[mask.bool()], rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("compiled", [False, True])
@pytest.mark.parametrize("packed", [False, True])
def test_sliding_window_model_is_refused(compiled, packed):
    """A sliding window is not expressible: refused eagerly (read from the mask function) and under
    torch.compile (read from the config), packed rows or not."""
    torch._dynamo.reset()
    cfg = tiny_config("mistral", vocab=VOCAB, layers=1, sliding_window=4, use_cache=False)
    model = tiny_model("dilcompile_dilated", configure(cfg, **SETTINGS), dtype=torch.float32)
    run = torch.compile(model, fullgraph=True, backend="eager") if compiled else model
    position_ids = torch.tensor([[0, 1, 2, 3, 0, 1, 2, 3, 4]]) if packed else None
    error = Exception if compiled else ValueError  # dynamo reports our ValueError inside its own exception
    with pytest.raises(error, match="expresses only plain causal or bidirectional"):
        run(torch.randint(0, VOCAB, (1, 9)), position_ids=position_ids)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("layout", ["padded", "packed"])
def test_training_gradients_equal_the_sum_over_sequences_alone(impl, layout):
    """Fine-tuning on a padded or packed batch: the weight gradients of a sum over real tokens equal
    the sum of each sequence's own gradients."""
    model = _llama(impl, use_cache=False)
    seqs = [_tokens(120 + i, n) for i, n in enumerate(_lengths(14, 3, 4, 15))]
    weights = torch.randn(VOCAB, dtype=torch.float64, generator=torch.Generator().manual_seed(3))

    def grads(logits):
        model.zero_grad()
        (logits @ weights).sum().backward()
        return [p.grad.clone() for p in model.parameters()]

    if layout == "padded":
        ids, mask = _padded(seqs, "left")
        logits = model(ids, attention_mask=mask, position_ids=_positions(mask)).logits[mask.bool()]
    else:
        position_ids = torch.cat([torch.arange(len(s)) for s in seqs])[None]
        logits = model(torch.cat(seqs)[None], position_ids=position_ids).logits[0]
    got = grads(logits)
    want = [sum(parts) for parts in zip(*(grads(model(s[None]).logits[0]) for s in seqs))]
    for name, g, w in zip((n for n, _ in model.named_parameters()), got, want):
        torch.testing.assert_close(g, w, rtol=1e-9, atol=1e-10, msg=name)


@pytest.mark.parametrize("impl", ["dilcompile_dilated", "dilcompile_block_sparse"])
def test_inductor_serving_under_no_grad_fullgraph_with_the_cache(impl):
    """How models are served: Inductor, fullgraph=True, eval, torch.no_grad, the KV cache on. It failed
    both ways — Inductor ran the runtime branch's subgraph on operands in other strides than it compiled
    ("expected ... stride 2560==32"), and with use_cache Dynamo lost the cache layers' attributes
    ("'DynamicLayer' object has no attribute 'dtype'"). Padded and packed rows, logits and the cache:
    compiled moves them from eager no more than 2 × sdpa's move (Inductor rounds Llama's float32 rotary
    tables differently, see above)."""
    seqs = [_tokens(60 + i, n) for i, n in enumerate([13, 9, 11])]
    ids, mask = _padded(seqs, "left")
    real = mask.bool()
    docs = _documents(5)
    packed, positions = torch.cat(docs)[None], torch.cat([torch.arange(len(d)) for d in docs])[None]
    moved = {}
    for name in (impl, "sdpa"):
        torch._dynamo.reset()
        model = _llama(name)
        compiled = torch.compile(model, fullgraph=True)
        with torch.no_grad():
            got, want = (m(ids, attention_mask=mask, use_cache=True) for m in (compiled, model))
            pairs = [(got.logits[real], want.logits[real])]
            pairs += [(got.past_key_values.layers[i].keys, want.past_key_values.layers[i].keys) for i in range(2)]
            pairs += [tuple(m(packed, position_ids=positions, use_cache=False).logits for m in (compiled, model))]
        moved[name] = max((a - b).abs().max().item() for a, b in pairs)
    assert moved[impl] <= 2 * moved["sdpa"] + 1e-12, moved


@pytest.mark.parametrize("order", ["packed first (≤ 5.23)", "positions first (5.24)", "nested"])
def test_the_packed_rows_mask_is_read_whatever_the_order_of_its_parts(order):
    """transformers 5.24 composes the packed-rows mask with its two parts the other way round; read by
    position, every packed batch was refused ("asks for 'and_mask'") — DataCollatorWithFlattening training."""
    from transformers import masking_utils as hf

    from dilcompile.integrations.transformers import _padding_mask

    ids = torch.tensor([[0, 0, 0, 1, 1, 2]])
    packed = hf.packed_sequence_mask_function(ids)
    remapped = hf.remap_positions_for_packed_sequence(hf.causal_mask_function, torch.tensor([[0, 1, 2, 0, 1, 0]]))
    composed = {"packed first (≤ 5.23)": hf.and_masks(packed, remapped),
                "positions first (5.24)": hf.and_masks(remapped, packed),
                "nested": hf.and_masks(hf.and_masks(remapped), packed)}[order]
    assert _padding_mask(1, 6, 6, mask_function=composed) is ids
    with pytest.raises(ValueError, match="and_mask"):  # a composition that is not packing: refused as before
        _padding_mask(1, 6, 6, mask_function=hf.and_masks(hf.causal_mask_function, hf.sliding_window_overlay(2)))
