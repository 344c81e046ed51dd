"""Hugging Face integration, configuration: the dilcompile_* keys are checked
when they are set — by attribute, configure(), AutoConfig / from_pretrained
keywords, or loading a saved config — with one error naming the key."""

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from dilcompile.integrations.transformers import configure, register
from helpers import tiny_config

register()

KEYS = {"dilcompile_segment_lengths": [4, 8], "dilcompile_dilation_rates": [1, 2]}


def _config():
    return tiny_config()


@pytest.fixture
def saved(tmp_path):
    """A tiny dense Llama checkpoint (sdpa, no dilcompile keys)."""
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(_config(), dtype=torch.float64)
    model.save_pretrained(tmp_path)
    return tmp_path, model


@pytest.mark.parametrize("value, error, says", [
    (64, TypeError, r"dilcompile_segment_lengths must be a list of ints.*\[64\].*int 64"),
    ("64", TypeError, r"dilcompile_segment_lengths must be a list of ints.*str '64'"),
    (["6", "4"], TypeError, r"dilcompile_segment_lengths must hold ints"),
    ([64, 0], ValueError, r"dilcompile_segment_lengths must be ≥ 1"),
    ([], ValueError, r"dilcompile_segment_lengths is empty"),
])
def test_bad_value_is_refused_when_set(value, error, says):
    cfg = _config()
    with pytest.raises(error, match=says):
        cfg.dilcompile_segment_lengths = value
    with pytest.raises(error, match=says):
        configure(cfg, segment_lengths=value, dilation_rates=[1])
    with pytest.raises(error, match=says):
        AutoConfig.for_model("llama", dilcompile_segment_lengths=value)


@pytest.mark.parametrize("key, value, error, says", [
    ("dilcompile_dilation_rates", 2, TypeError, r"dilcompile_dilation_rates must be a list of ints.*\[2\]"),
    ("dilcompile_mode", "dense", ValueError, r"dilcompile_mode must be one of"),
    ("dilcompile_pattern", "local_window(", ValueError, r"dilcompile_pattern = 'local_window\(' is not a valid"),
    ("dilcompile_pattern", 7, TypeError, r"dilcompile_pattern must be a pattern spec string"),
    ("dilcompile_block_size", "128", TypeError, r"dilcompile_block_size must be a positive int"),
])
def test_other_keys_are_checked_when_set(key, value, error, says):
    with pytest.raises(error, match=says):
        setattr(_config(), key, value)


def test_configure_checks_the_keys_together_and_sets_every_config_of_a_model():
    with pytest.raises(ValueError, match="same length"):
        configure(_config(), segment_lengths=[4, 8], dilation_rates=[1])
    with pytest.raises(ValueError, match="no dilcompile_dilation_rates"):
        configure(_config(), segment_lengths=[4, 8])
    with pytest.raises(TypeError, match="configure takes a transformers model or PreTrainedConfig"):
        configure({"segment_lengths": [4]}, segment_lengths=[4], dilation_rates=[1])
    model = AutoModelForCausalLM.from_config(_config(), attn_implementation="dilcompile_dilated")
    assert configure(model, segment_lengths=[4, 8], dilation_rates=[1, 2], mode="groups") is model
    for layer in model.model.layers:
        assert layer.self_attn.config.dilcompile_segment_lengths == [4, 8]
        assert layer.self_attn.config.dilcompile_mode == "groups"
    model(torch.randint(0, 61, (1, 11)))


def test_from_pretrained_keywords_configure_the_model(saved):
    """The obvious path: keys as from_pretrained keywords (a TypeError from the model's __init__ before)."""
    path, dense = saved
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="dilcompile_dilated",
                                                 dtype=torch.float64, **KEYS)
    assert model.config.dilcompile_segment_lengths == [4, 8]
    ids = torch.randint(0, 61, (2, 19))
    built = AutoModelForCausalLM.from_config(configure(_config(), segment_lengths=[4, 8], dilation_rates=[1, 2]),
                                             attn_implementation="dilcompile_dilated", dtype=torch.float64)
    built.load_state_dict(dense.state_dict())
    torch.testing.assert_close(model(ids).logits, built.eval()(ids).logits, rtol=1e-12, atol=1e-12)
    with pytest.raises(TypeError, match="dilcompile_segment_lengths must be a list of ints"):
        AutoModelForCausalLM.from_pretrained(path, attn_implementation="dilcompile_dilated",
                                             dilcompile_segment_lengths=64, dilcompile_dilation_rates=[1])


def test_autoconfig_keywords_are_kept_and_saved(saved, tmp_path_factory):
    """AutoConfig.from_pretrained(path, dilcompile_...=...) kept the keys (it dropped them silently before);
    save_pretrained writes them to config.json and loading checks them again."""
    path, _ = saved
    cfg = AutoConfig.from_pretrained(path, **KEYS)
    assert (cfg.dilcompile_segment_lengths, cfg.dilcompile_dilation_rates) == ([4, 8], [1, 2])
    out = tmp_path_factory.mktemp("configured")
    cfg.save_pretrained(out)
    assert json.loads((out / "config.json").read_text())["dilcompile_segment_lengths"] == [4, 8]
    assert AutoConfig.from_pretrained(out).dilcompile_dilation_rates == [1, 2]
    (out / "config.json").write_text(json.dumps(
        json.loads((out / "config.json").read_text()) | {"dilcompile_dilation_rates": 2}))
    with pytest.raises(TypeError, match="dilcompile_dilation_rates must be a list of ints"):
        AutoConfig.from_pretrained(out)


def test_unset_keys_read_as_none_and_fail_at_forward_naming_the_key():
    cfg = _config()
    assert cfg.dilcompile_segment_lengths is None and "dilcompile_segment_lengths" not in cfg.to_dict()
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="dilcompile_block_sparse")
    with pytest.raises(ValueError, match="no dilcompile_pattern; set it with .*configure"):
        model(torch.randint(0, 61, (1, 5)))


def test_a_checkpoint_saved_with_our_attention_warns_when_reloaded_with_another(saved, tmp_path_factory):
    """Reloaded without attn_implementation=, a checkpoint saved with dilcompile_* keys ran sdpa silently
    (logits off by 1.34 in the probe): one warning naming the argument; none when it is passed."""
    import warnings

    path, _ = saved
    ours = AutoModelForCausalLM.from_pretrained(path, attn_implementation="dilcompile_dilated", **KEYS)
    again = tmp_path_factory.mktemp("ours")
    ours.save_pretrained(again)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        reloaded = AutoModelForCausalLM.from_pretrained(again)
    said = [str(w.message) for w in caught if "dilcompile_" in str(w.message)]
    assert reloaded.config._attn_implementation == "sdpa"
    assert len(said) == 1 and "attn_implementation='dilcompile_dilated'" in said[0] and "'sdpa'" in said[0], said
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        reloaded = AutoModelForCausalLM.from_pretrained(again, attn_implementation="dilcompile_dilated")
    assert reloaded.config._attn_implementation == "dilcompile_dilated"
    assert not [w for w in caught if "dilcompile_" in str(w.message)]


_BEFORE_REGISTER = r"""
import json, sys, torch
from transformers import AutoConfig, AutoModelForCausalLM
config = AutoConfig.from_pretrained(sys.argv[1])  # a checkpoint saved with our attention's keys
from dilcompile.integrations.transformers import register
register()  # the usual order: a config loaded first, then register(), then the model
model = AutoModelForCausalLM.from_config(config, attn_implementation="dilcompile_block_sparse", dtype=torch.float64)
ids = torch.randint(0, 61, (1, 16), generator=torch.Generator().manual_seed(0))
with torch.no_grad():
    try:
        compiled = torch.compile(model.eval(), fullgraph=True, backend="aot_eager")(ids).logits
    except Exception as err:
        print(json.dumps({"error": f"{type(err).__name__}: {err}"[:300]}))
        sys.exit(0)
    print(json.dumps({"moved": (compiled - model(ids).logits).abs().max().item()}))
"""


@pytest.mark.parametrize("spec, ok", [("local_window(window=3)", True), ("local_window(width=3)", False)])
def test_a_config_loaded_before_register_compiles_or_fails_naming_the_key(saved, spec, ok):
    """A config loaded before register() holds its keys unchecked and its pattern unparsed: a compiled
    fullgraph model raised KeyError('local_window(window=3)') inside the trace. The keys are now checked,
    and the pattern parsed, when the model is built with our attention; a bad one fails there."""
    import os
    import subprocess
    import sys

    path, _ = saved
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps(config | {"dilcompile_pattern": spec, "dilcompile_block_size": 4}))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).resolve().parents[1]),
                                                        os.environ.get("PYTHONPATH", "")]))
    run = subprocess.run([sys.executable, "-c", _BEFORE_REGISTER, str(path), spec], capture_output=True, text=True,
                         env=env, timeout=600)
    if ok:
        assert run.returncode == 0, run.stderr[-3000:]
        assert json.loads(run.stdout.strip().splitlines()[-1]) == {"moved": 0.0}
    else:
        assert run.returncode != 0 and "ValueError: dilcompile_pattern = 'local_window(width=3)'" in run.stderr, \
            run.stderr[-2000:]
