"""Compiled Hugging Face models as they are served, across model families:
Llama, Qwen2 and GPT-2 (decoders) and BERT (encoder), both attention names,
Inductor with ``fullgraph=True`` (no graph break, so the same graph serves
without fullgraph), under ``torch.inference_mode`` and ``torch.no_grad``,
padded batches with the KV cache on, packed rows with it off — each compared
with the eager model, and new pad patterns counted as recompiles (none).
Tiny models from configs, float32, one layer: what compiles in seconds."""

import pytest
import torch
from torch._dynamo.utils import counters

from dilcompile.integrations.transformers import configure, register
from helpers import tiny_config, tiny_model
from test_hf_batches import IMPLS, SETTINGS, VOCAB

register()

FAMILIES = ("llama", "qwen2", "gpt2", "bert")


def _model(family, impl):
    config = tiny_config(family, vocab=VOCAB, hidden=32, layers=1, heads=4, positions=64)
    return tiny_model(impl, configure(config, **SETTINGS), dtype=torch.float32)


def _padded(seed):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(5, 19, (3,), generator=g).tolist()
    n = 20  # one shape: only the pad pattern changes between calls
    ids, mask = torch.zeros(3, n, dtype=torch.long), torch.zeros(3, n, dtype=torch.long)
    for b, length in enumerate(lengths):
        ids[b, n - length:] = torch.randint(1, VOCAB, (length,), generator=g)
        mask[b, n - length:] = 1
    return ids, mask


def _output(result):
    return result.logits if hasattr(result, "logits") else result.last_hidden_state


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("family", FAMILIES)
def test_compiled_fullgraph_serving_equals_eager(family, impl):
    model = _model(family, impl)
    decoder = family != "bert"
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(model, fullgraph=True)
    for grad_mode, seed in ((torch.inference_mode, 0), (torch.no_grad, 1), (torch.no_grad, 2)):
        ids, mask = _padded(seed)
        real = mask.bool()
        kw = {"use_cache": True} if decoder else {}
        with grad_mode():
            got, want = (m(ids, attention_mask=mask, **kw) for m in (compiled, model))
        torch.testing.assert_close(_output(got)[real], _output(want)[real], rtol=1e-5, atol=1e-5,
                                   msg=f"{grad_mode.__name__}, padded")
        if decoder:
            for i in range(len(model.config.layer_types) if hasattr(model.config, "layer_types") else 1):
                torch.testing.assert_close(got.past_key_values.layers[i].keys, want.past_key_values.layers[i].keys,
                                           rtol=1e-5, atol=1e-5)
    # one graph per grad mode (a guard), none for the second pad pattern
    assert counters["stats"]["unique_graphs"] <= 2, dict(counters["stats"])
    assert not counters["graph_break"], dict(counters["graph_break"])
    if decoder:  # packed rows: positions restart at each document, no mask, no cache
        docs = [torch.randint(1, VOCAB, (n,), generator=torch.Generator().manual_seed(n)) for n in (7, 3, 11)]
        packed = torch.cat(docs)[None]
        positions = torch.cat([torch.arange(len(d)) for d in docs])[None]
        with torch.no_grad():
            got = compiled(packed, position_ids=positions, use_cache=False).logits
            want = model(packed, position_ids=positions, use_cache=False).logits
            alone = torch.cat([model(d[None], use_cache=False).logits for d in docs], dim=1)
        torch.testing.assert_close(want, alone, rtol=1e-5, atol=1e-5, msg="eager packed rows vs each alone")
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5, msg="compiled packed rows")
