"""Hugging Face static-cache serving: ``generate(..., cache_implementation="static")``,
eager and with a compiled forward, equals generation with the default
``DynamicCache`` token for token and logit for logit, left-padded batches
included; the compiled decode step is one graph over every step.

A static cache hands the attention its whole ``max_cache_len`` buffer with
the queries in the middle and unwritten slots after them; the mask function
describes the slots (``hf_sequences.slot_map``). A decode step (one query
per row) gathers the keys it attends straight out of the cache
(``hf_sequences.decode_step``); a prefill rotates the written slots to the
end of the key axis (``hf_sequences.cache_order``), where the padded path
places its queries (docs/design.md, "Variable-length batches"; docs/serving.md)."""

import importlib

import pytest
import torch
from torch._dynamo.utils import counters
from transformers import CompileConfig

from dilcompile.integrations import hf_sequences
from dilcompile.integrations.transformers import _padding_mask, configure, register
from helpers import tiny_config, tiny_model
from test_hf_batches import IMPLS, SETTINGS, VOCAB, _lengths, _llama, _padded, _tokens

register()

GREEDY = {"max_new_tokens": 10, "min_new_tokens": 10, "do_sample": False, "pad_token_id": 0,
          "output_logits": True, "return_dict_in_generate": True}


def _prompts(seed):
    prompts = [_tokens(seed * 10 + i, n) for i, n in enumerate(_lengths(seed, 3, 6, 17))]
    return _padded(prompts, "left")


def _small_llama(impl):
    """One layer, float32: what compiles in seconds."""
    return tiny_model(impl, configure(tiny_config(vocab=VOCAB, layers=1), **SETTINGS), dtype=torch.float32)


def _assert_same_generation(got, want, atol):
    assert torch.equal(got.sequences, want.sequences)
    for step, (a, b) in enumerate(zip(got.logits, want.logits)):
        torch.testing.assert_close(a, b, rtol=0, atol=atol, msg=f"step {step}")


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("seed, holes", [(7, False), (8, False), (9, True)])
def test_static_cache_generate_equals_dynamic_cache(impl, seed, holes):
    """Real dilation / sparsity (segments shorter than the prompts), left padding — and with ``holes``
    a pad inside each row too (padding is absence wherever it is) — float64: equal to rounding.
    Refused before ("keys do not end at the last query")."""
    model = _llama(impl)
    ids, mask = _prompts(seed)
    if holes:  # one of each row's real tokens, not its last, masked out
        g = torch.Generator().manual_seed(seed)
        for row in mask:
            real = row.nonzero()[:-1, 0]
            row[real[int(torch.randint(len(real), (), generator=g))]] = 0
    dynamic = model.generate(ids, attention_mask=mask, **GREEDY)
    static = model.generate(ids, attention_mask=mask, cache_implementation="static", **GREEDY)
    _assert_same_generation(static, dynamic, atol=1e-10)


@pytest.mark.parametrize("impl", IMPLS)
def test_compiled_static_cache_decode_is_one_graph_and_equals_eager(impl):
    """transformers' own serving path: with a static cache, generate compiles the decode step
    (``compile_config``; on CPU only when asked with ``_compile_all_devices``). fullgraph, float32:
    tokens equal, logits within 1e-5 of eager DynamicCache generation; 9 decode steps, one graph."""
    model = _small_llama(impl)
    ids, mask = _prompts(7)
    eager = model.generate(ids, attention_mask=mask, **GREEDY)
    config = CompileConfig(fullgraph=True, mode="default")
    config._compile_all_devices = True
    torch._dynamo.reset()
    counters.clear()
    compiled = model.generate(ids, attention_mask=mask, cache_implementation="static", compile_config=config,
                              **GREEDY)
    _assert_same_generation(compiled, eager, atol=1e-5)
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])
    assert not counters["recompiles"], dict(counters["recompiles"])


@pytest.mark.parametrize("impl", IMPLS)
def test_compiled_decode_serves_caches_of_new_lengths(impl):
    """A server's requests differ in length: a generate that needs a longer static cache builds a new one,
    and Dynamo compiles the decode step again, now for any cache length (automatic dynamic shapes).
    Block-sparse failed there ("assume_constant_result argument conversion failed": its count of key blocks
    needs the length as a number); traced for any length it counts them at the model's longest sequence.
    Tokens equal eager generation at each length, logits within 1e-5; a third length compiles nothing."""
    model = _small_llama(impl)
    ids, mask = _prompts(7)
    config = CompileConfig(fullgraph=True, mode="default")
    config._compile_all_devices = True
    torch._dynamo.reset()
    graphs = []
    for new in (4, 9, 15):  # each cache longer than the last
        settings = GREEDY | {"max_new_tokens": new, "min_new_tokens": new}
        eager = model.generate(ids, attention_mask=mask, **settings)
        before = counters["stats"]["unique_graphs"]
        compiled = model.generate(ids, attention_mask=mask, cache_implementation="static", compile_config=config,
                                  **settings)
        graphs.append(counters["stats"]["unique_graphs"] - before)
        _assert_same_generation(compiled, eager, atol=1e-5)
    assert graphs == [1, 1, 0], graphs


def test_compiled_forward_serves_prefill_and_decode_with_two_graphs():
    """The other common recipe: ``model.forward = torch.compile(model.forward, fullgraph=True)``, so the
    prefill is compiled too — one graph for it, one for every decode step."""
    model = _small_llama("dilcompile_dilated")
    ids, mask = _prompts(8)
    eager = model.generate(ids, attention_mask=mask, **GREEDY)
    torch._dynamo.reset()
    counters.clear()
    model.forward = torch.compile(model.forward, fullgraph=True)
    with torch.no_grad():
        compiled = model.generate(ids, attention_mask=mask, cache_implementation="static", **GREEDY)
    _assert_same_generation(compiled, eager, atol=1e-5)
    assert counters["stats"]["unique_graphs"] == 2, dict(counters["stats"])


@pytest.mark.parametrize("seed", range(6))
def test_cache_order_puts_the_written_slots_last_in_order(seed):
    """Random batch, cache size, written length, queries and padding: after the rotation the keys the
    padded path keeps are each row's real written slots in slot order, ending with the query slots."""
    g = torch.Generator().manual_seed(seed)
    batch, slots = int(torch.randint(1, 4, (), generator=g)), int(torch.randint(2, 40, (), generator=g))
    q_length = int(torch.randint(1, slots + 1, (), generator=g))
    q_offset = int(torch.randint(0, slots - q_length + 1, (), generator=g))
    padding = torch.rand(batch, q_offset + q_length, generator=g) > 0.3
    padding[:, q_offset:] = True  # new tokens are real
    as_tensor = bool(seed % 2)  # transformers keeps a static cache's written length as a tensor
    offset = torch.tensor(q_offset) if as_tensor else q_offset
    codes = hf_sequences.slot_map(padding, batch, offset, q_length, slots, "cpu")
    keys = torch.arange(slots, dtype=torch.float64).expand(batch, 2, slots)[..., None]  # (B, H, S, 1): slot index
    k, v, pads = hf_sequences.cache_order(keys, keys + 0.5, codes)
    for b in range(batch):
        real = padding[b].nonzero().flatten().double()
        assert torch.equal(k[b, 0, ~pads[b], 0], real)
        assert torch.equal(v[b, 1, ~pads[b], 0], real + 0.5)
        assert torch.equal(k[b, 0, -q_length:, 0], torch.arange(q_offset, q_offset + q_length).double())


@pytest.mark.parametrize("seed", range(12))
def test_slot_map_gives_each_slot_its_kind_and_each_position_its_slot(seed):
    """Random batch, cache size, written length and pads anywhere (the first slot, runs, none, all):
    codes never decrease along a row; a slot is real exactly where written and kept; a real slot's
    code // 2 is its position; the table holds the slot of each row's i-th real token, and a slot in
    range past a row's real tokens."""
    g = torch.Generator().manual_seed(300 + seed)
    batch, slots = int(torch.randint(1, 5, (), generator=g)), int(torch.randint(1, 70, (), generator=g))
    written = int(torch.randint(1, slots + 1, (), generator=g))
    padding = torch.rand(batch, written, generator=g) < torch.rand((), generator=g)
    offset = torch.tensor(written - 1) if seed % 2 else written - 1
    slot_map = hf_sequences.slot_map(padding, batch, offset, 1, slots, "cpu")
    assert hf_sequences.is_slot_map(slot_map) and slot_map.shape == (batch, 1, 2, slots)
    codes, table = slot_map[:, 0, hf_sequences.CODES], slot_map[:, 0, hf_sequences.REAL_SLOTS]
    assert bool((codes[:, 1:] >= codes[:, :-1]).all())
    real = torch.zeros(batch, slots, dtype=torch.bool)
    real[:, :written] = padding
    assert torch.equal(hf_sequences.is_real(codes), real)
    assert bool((codes[:, written:] == hf_sequences.EMPTY).all())
    assert bool(((table >= 0) & (table < slots)).all())
    for b in range(batch):
        where = real[b].nonzero()[:, 0]
        assert torch.equal(codes[b, where] // 2, torch.arange(len(where), dtype=codes.dtype))
        assert torch.equal(table[b, : len(where)].long(), where), b


def test_sliding_caches_and_masks_longer_than_the_cache_are_refused():
    from transformers.masking_utils import causal_mask_function

    common = dict(batch_size=1, q_length=1, mask_function=causal_mask_function, device="cpu")
    with pytest.raises(ValueError, match="sliding-window cache"):
        _padding_mask(kv_length=8, q_offset=9, kv_offset=2, **common)
    with pytest.raises(ValueError, match="max_cache_len"):
        _padding_mask(kv_length=8, q_offset=torch.tensor(3), attention_mask=torch.ones(1, 9), **common)


@pytest.mark.parametrize("name", ["dilated_varlen_fwd", "dilated_varlen_bwd", "block_sparse_varlen_fwd",
                                  "block_sparse_varlen_bwd", "block_sparse_fwd", "block_sparse_bwd",
                                  "counted_attention_reference", "masked_attention_reference"])
def test_ops_that_read_values_on_the_host_are_kept_out_of_cuda_graphs(name):
    """transformers compiles generate's decode step with mode="reduce-overhead" on CUDA (CUDA graphs); a
    graph holding an op that reads tensor values on the host (the padded path's metadata, block-sparse's
    non-finite check) cannot be captured. Tagged cudagraph_unsafe, Inductor runs such a graph without
    CUDA graphs instead of failing at capture."""
    for module in ("dilated.varlen_ops", "dilated.impl.reference", "block_sparse.ops", "block_sparse.varlen_ops",
                   "block_sparse.impl.reference"):  # importing a module registers its ops
        importlib.import_module(f"dilcompile.{module}")
    assert torch.Tag.cudagraph_unsafe in getattr(torch.ops.dilcompile, name).default.tags


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("batch, seed", [(1, 0), (5, 1), (8, 2)])
def test_static_cache_decode_of_random_left_paddings_equals_dynamic_cache(impl, batch, seed):
    """Batch 1 to 8, random prompt lengths (left pads from none to most of a row), GQA 6/2 heads, float64:
    every step's logits equal to rounding, tokens equal."""
    model = _llama(impl)
    prompts = [_tokens(seed * 100 + i, n) for i, n in enumerate(_lengths(seed, batch, 2, 21))]
    ids, mask = _padded(prompts, "left")
    dynamic = model.generate(ids, attention_mask=mask, **GREEDY)
    static = model.generate(ids, attention_mask=mask, cache_implementation="static", **GREEDY)
    _assert_same_generation(static, dynamic, atol=1e-10)


@pytest.mark.parametrize("impl, settings", [
    ("dilcompile_dilated", {"segment_lengths": [512], "dilation_rates": [1]}),
    ("dilcompile_block_sparse", {"pattern": "local_window(window=512)", "block_size": 4})])
def test_static_cache_decode_at_a_dense_configuration_equals_sdpa(impl, settings):
    """One segment covering the cache at rate 1, a window covering it: the decode step attends every key
    once, sdpa's attention — its tokens and logits (float64)."""
    ids, mask = _prompts(3)
    kw = dict(attention_mask=mask, cache_implementation="static", **GREEDY)
    sdpa = _llama("sdpa").generate(ids, **kw)
    model = _llama(impl)
    configure(model, **settings)
    _assert_same_generation(model.generate(ids, **kw), sdpa, atol=1e-10)


_GRAPHS = []  # recorded by _record: transformers deep-copies its compile config, backend included


def _record(gm, example_inputs, **options):
    """A torch.compile backend that keeps each graph's call targets (functions, and methods by name) and
    runs the graph as traced."""
    _GRAPHS.append([node.target for node in gm.graph.nodes if node.op in ("call_function", "call_method")])
    return gm.forward


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("padded", [True, False])
def test_compiled_decode_step_is_plain_tensor_ops(impl, padded):
    """The decode graph (padded rows, and one unpadded row: no per-row path) holds no custom op — gathers,
    products, a softmax Inductor can fuse, nothing a CUDA graph cannot capture — and reads the cache
    with no rotation (no index_select over its slots) and no bookkeeping over them."""
    model = _small_llama(impl)
    ids, mask = _prompts(7) if padded else (_tokens(5, 9)[None], torch.ones(1, 9, dtype=torch.long))
    _GRAPHS.clear()
    torch._dynamo.reset()
    config = CompileConfig(fullgraph=True, backend=_record)
    config._compile_all_devices = True
    with torch.no_grad():
        model.generate(ids, attention_mask=mask, cache_implementation="static", compile_config=config, **GREEDY)
    assert len(_GRAPHS) == 1, len(_GRAPHS)
    targets = _GRAPHS[0]
    ops = [t for t in targets if isinstance(t, torch._ops.OpOverloadPacket | torch._ops.OpOverload)]
    assert not [t for t in ops if "dilcompile" in str(t)], ops
    assert torch.index_select not in targets and torch.Tensor.index_select not in targets
    # The slot map comes in prepared (4-D: transformers builds it once a step, outside the graph): no
    # running count or scatter over the cache's slots inside the decode step.
    assert not {torch.cumsum, torch.scatter, "cumsum", "scatter", "scatter_"} & set(targets), targets
