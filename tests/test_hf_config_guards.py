"""Hugging Face integration, compiled models: every dilcompile_* key the
attention reads is guarded, set or not, so setting one after compiling
recompiles and the compiled model equals the new eager one."""

import pytest
import torch
from torch._dynamo.testing import CompileCounter
from transformers import AutoModel, CLIPConfig

from dilcompile.integrations.hf_config import CHECKS
from dilcompile.integrations.transformers import configure, register
from helpers import tiny_config, tiny_model

register()

VOCAB = 61
BRANCHES = {"segment_lengths": [4, 8], "dilation_rates": [1, 2]}
PATTERN = {"pattern": "union(local_window(window=3), dilated(segment_lengths=(8,), dilation_rates=(2,)))"}


def _model(impl, **keys):
    config = tiny_config(vocab=VOCAB, hidden=32, layers=1, heads=4, positions=64)
    return tiny_model(impl, configure(config, **keys))


@pytest.mark.parametrize("how", ["configure", "attribute"])
@pytest.mark.parametrize("impl, keys, key, value", [
    ("dilcompile_dilated", BRANCHES, "mode", "groups"),
    ("dilcompile_block_sparse", PATTERN, "block_size", 4),
])
def test_a_key_unset_when_compiled_and_set_after_recompiles(impl, keys, key, value, how):
    """The probe: configure(model, mode="groups") on a model compiled while its config had no
    dilcompile_mode kept the "longnet" graph (0.14 off the new eager model). Now the key is held as None
    from the model's build, Dynamo guards it, and the next call recompiles."""
    model = _model(impl, **keys)
    ids = torch.randint(0, VOCAB, (2, 16), generator=torch.Generator().manual_seed(1))
    counter = CompileCounter()
    run = torch.compile(model, backend=counter, fullgraph=True)
    with torch.no_grad():
        before = run(ids).logits
        if how == "configure":
            configure(model, **{key: value})
        else:
            setattr(model.config, f"dilcompile_{key}", value)
        after = run(ids).logits
        eager = model(ids).logits
    assert counter.frame_count == 2  # recompiled for the new value
    torch.testing.assert_close(after, eager, rtol=0, atol=0)
    if key == "mode":  # the block size tiles the same pattern: equal results, only the recompile shows
        assert (before - eager).abs().max() > 1e-3


def test_a_key_missing_under_a_trace_is_refused_in_one_line():
    """A config whose key was never stored (switched to our attention in a way that skipped the build
    check) cannot be guarded: the compile says so; an eager call stores it and the compile then works."""
    model = _model("dilcompile_dilated", **BRANCHES)
    del model.config.__dict__["dilcompile_mode"]
    ids = torch.randint(0, VOCAB, (1, 12), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        torch._dynamo.reset()
        with pytest.raises(Exception, match="LlamaConfig has no dilcompile_mode entry, so a compiled model could"):
            torch.compile(model, backend="eager", fullgraph=True)(ids)
        eager = model(ids).logits
        assert "dilcompile_mode" in model.config.__dict__
        torch._dynamo.reset()
        torch.testing.assert_close(torch.compile(model, backend="eager", fullgraph=True)(ids).logits, eager,
                                   rtol=0, atol=0)


def test_every_config_of_a_composite_model_holds_every_key():
    """CLIP's attention modules read the text and vision sub-configs, which the top config holds."""
    config = CLIPConfig(text_config=dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=4, max_position_embeddings=32),
                        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                           num_attention_heads=4, image_size=8, patch_size=4), projection_dim=16)
    model = AutoModel.from_config(configure(config, **BRANCHES), attn_implementation="dilcompile_dilated")
    for each in (model.config, model.config.text_config, model.config.vision_config):
        assert set(CHECKS) <= set(each.__dict__), type(each).__name__
    assert model.config.text_config.dilcompile_mode is None
