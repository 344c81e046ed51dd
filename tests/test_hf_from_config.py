"""``AutoModelForCausalLM.from_config(config, dilcompile_...=...)`` takes our keys as
``from_pretrained`` does (transformers handed them to the model's ``__init__``: TypeError)."""

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig

from dilcompile.integrations.transformers import configure, register

register()


def _config():
    return LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                       vocab_size=50)


def test_from_config_takes_our_keys_on_a_copy_of_the_config():
    config = _config()
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="dilcompile_dilated",
                                             dilcompile_segment_lengths=[4, 8], dilcompile_dilation_rates=[1, 2])
    assert model.config.dilcompile_segment_lengths == [4, 8] and model.config.dilcompile_dilation_rates == [1, 2]
    assert getattr(config, "dilcompile_segment_lengths", None) is None  # the caller's config is untouched
    configure(config, segment_lengths=[4, 8], dilation_rates=[1, 2])
    torch.manual_seed(0)
    same = AutoModelForCausalLM.from_config(config, attn_implementation="dilcompile_dilated")
    ids = torch.randint(50, (2, 19))
    torch.testing.assert_close(model(ids).logits, same(ids).logits, rtol=0, atol=0)


def test_from_config_checks_our_keys():
    with pytest.raises(TypeError, match="dilcompile_segment_lengths"):
        AutoModelForCausalLM.from_config(_config(), attn_implementation="dilcompile_dilated",
                                         dilcompile_segment_lengths=8, dilcompile_dilation_rates=[1])
    with pytest.raises(TypeError, match="unexpected keyword argument 'not_a_key'"):  # other keywords: as before
        AutoModelForCausalLM.from_config(_config(), not_a_key=1)
