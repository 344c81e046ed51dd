"""Block-sparse attention with queries shorter than keys inside ``torch.compile(fullgraph=True)`` — a
compiled forward decoding with transformers' default DynamicCache and no padding (batch 1). Eagerly the
candidate keys are listed by value (a data-dependent count); under tracing every key is a candidate and
``mask_mod`` decides, so the graph has fixed shapes. Raised Dynamo's "Could not guard on data-dependent
expression" before."""

import pytest
import torch

from dilcompile import block_sparse_attention
from dilcompile.patterns.spec import from_spec


@pytest.mark.parametrize("nq", [1, 3])
def test_compiled_shorter_queries_equal_eager(nq):
    pattern = from_spec("union(global_local(window=3, global_tokens=2), dilated(segment_lengths=(8,), "
                        "dilation_rates=(2,)))")
    g = torch.Generator().manual_seed(nq)
    q = torch.randn(2, 4, nq, 8, generator=g, dtype=torch.float64)
    k, v = (torch.randn(2, 4, 37, 8, generator=g, dtype=torch.float64) for _ in range(2))

    def attend(q, k, v):
        return block_sparse_attention(q, k, v, pattern, causal=True, block_size=4)

    compiled = torch.compile(attend, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(q, k, v), attend(q, k, v), rtol=1e-12, atol=1e-12)


def test_compiled_forward_generates_one_unpadded_row_with_the_dynamic_cache():
    """The Hugging Face recipe that failed: a compiled forward, the default DynamicCache, batch 1."""
    pytest.importorskip("transformers")
    from test_hf_batches import _llama, _tokens

    model = _llama("dilcompile_block_sparse")
    ids = _tokens(3, 11)[None]
    kw = dict(max_new_tokens=6, min_new_tokens=6, do_sample=False, pad_token_id=0, output_logits=True,
              return_dict_in_generate=True)
    eager = model.generate(ids, **kw)
    model.forward = torch.compile(model.forward, fullgraph=True, backend="aot_eager")
    with torch.no_grad():
        compiled = model.generate(ids, **kw)
    assert torch.equal(compiled.sequences, eager.sequences)
    for a, b in zip(compiled.logits, eager.logits):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)
