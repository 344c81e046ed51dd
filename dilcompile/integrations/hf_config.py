"""The ``dilcompile_*`` keys of a Hugging Face model config, checked when they are set.

``install_config_keys()`` (called by ``register()``) makes each key a
validating attribute of transformers' ``PreTrainedConfig``, so every way of
setting one checks it there and then, with one error naming the key:

    config.dilcompile_segment_lengths = [2048, 4096]                  # attribute
    AutoConfig.from_pretrained(path, dilcompile_segment_lengths=[...])  # kwargs
    AutoModel.from_pretrained(path, attn_implementation="dilcompile_dilated",
                              dilcompile_segment_lengths=[...], dilcompile_dilation_rates=[...])
    configure(model_or_config, segment_lengths=[...], dilation_rates=[...])  # also checks the keys together

Values are stored in the instance's ``__dict__`` as plain lists, ints and
strings, so ``to_dict`` / ``save_pretrained`` write them to config.json and
loading the checkpoint sets (and checks) them again. A config switched to our
attention holds every key, None where unset (``check_config``), so a compiled
model guards on each key the attention reads and recompiles when one is set
later.
"""

from __future__ import annotations

from ..checks import check_positive_ints
from ..dilated.geometry import MODES
from ..patterns import from_spec
from ..tracing import tracing

_PATTERNS: dict = {}  # spec string → Pattern, built eagerly when the key is set (compiled code only reads it)


def _int_list(key: str, value) -> list[int]:
    if isinstance(value, (int, str, bytes)):
        example = f"[{value}]" if isinstance(value, int) and not isinstance(value, bool) else "[2048, 4096]"
        raise TypeError(f"{key} must be a list of ints, one per branch, e.g. {example}; got the "
                        f"{type(value).__name__} {value!r}")
    return list(check_positive_ints(key, value))


def _mode(key: str, value) -> str:
    if value not in MODES:
        raise ValueError(f"{key} must be one of {MODES}, got {value!r}")
    return value


def _pattern(key: str, value) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{key} must be a pattern spec string such as 'local_window(window=256)' (a config is "
                        f"saved as JSON), got {type(value).__name__} {value!r}")
    try:
        _PATTERNS[value] = from_spec(value)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{key} = {value!r} is not a valid pattern spec: {err}") from err
    return value


def _block_size(key: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise TypeError(f"{key} must be a positive int such as 128, got {type(value).__name__} {value!r}")
    return value


CHECKS = {  # key → check(key, value) → the value to store
    "dilcompile_segment_lengths": _int_list,
    "dilcompile_dilation_rates": _int_list,
    "dilcompile_mode": _mode,
    "dilcompile_pattern": _pattern,
    "dilcompile_block_size": _block_size,
}


class _CheckedKey:
    """A config attribute checked on assignment; None (the default) means unset."""

    def __init__(self, key: str):
        self.key = key

    def __get__(self, config, owner=None):
        if config is None:
            return self
        return config.__dict__.get(self.key)

    def __set__(self, config, value):
        config.__dict__[self.key] = None if value is None else CHECKS[self.key](self.key, value)


def install_config_keys() -> None:
    """Make the ``dilcompile_*`` keys checked attributes of every transformers config (idempotent)."""
    from transformers import PreTrainedConfig

    for key in CHECKS:
        if not isinstance(PreTrainedConfig.__dict__.get(key), _CheckedKey):
            setattr(PreTrainedConfig, key, _CheckedKey(key))


def check_config(config) -> None:
    """Check every ``dilcompile_*`` key of ``config`` and of the configs it
    holds (a composite model's text / vision configs), eagerly, and store the
    unset ones as None; run when a model is built or switched to our attention.

    A config built before ``register()`` holds its keys unchecked (set before
    the attributes were ours); checking also parses its pattern for compiled
    code to look up. The explicit None is for torch.compile: Dynamo guards on
    a key in a config's ``__dict__`` but not on a key's absence (torch 2.13),
    so a model compiled before ``config.dilcompile_mode`` was set kept its
    old graph; with the key present, setting it recompiles."""
    from transformers import PreTrainedConfig

    stack, seen = [config], set()
    while stack:
        each = stack.pop()
        if id(each) in seen:
            continue
        seen.add(id(each))
        for key, check in CHECKS.items():
            value = each.__dict__.get(key)
            each.__dict__[key] = None if value is None else check(key, value)
        for value in list(each.__dict__.values()):  # sub-configs, alone or in lists (per-layer configs)
            items = value if isinstance(value, (list, tuple)) else (value,)
            stack.extend(item for item in items if isinstance(item, PreTrainedConfig))


def check_branches_of(config) -> tuple[tuple[int, ...], tuple[int, ...], str]:
    """(segment_lengths, dilation_rates, mode) of a config for ``"dilcompile_dilated"``."""
    segments = _required(config, "dilcompile_segment_lengths", "[2048, 4096]")
    rates = _required(config, "dilcompile_dilation_rates", "[1, 2]")
    if len(segments) != len(rates):
        raise ValueError(f"dilcompile_segment_lengths {segments} and dilcompile_dilation_rates {rates} must have "
                         "the same length (one rate per segment length)")
    return tuple(segments), tuple(rates), _value(config, "dilcompile_mode") or "longnet"


def pattern_of(config):
    """(Pattern, block_size) of a config for ``"dilcompile_block_sparse"``."""
    spec = _required(config, "dilcompile_pattern", "'local_window(window=256)'")
    # Built when the key was set or the model built; compiled code only looks it up (a pattern built
    # inside a trace has no op arguments).
    if spec not in _PATTERNS:
        raise ValueError(f"dilcompile_pattern {spec!r} was never parsed: set it after register(), or build or "
                         "switch the model (attn_implementation='dilcompile_block_sparse') after register()")
    return _PATTERNS[spec], _value(config, "dilcompile_block_size") or 128


def _value(config, key: str):
    """A key as the attention reads it, None if unset. Read from ``__dict__``
    where ``check_config`` put it; a compiled model reading a key absent there
    could not notice it being set later (no guard on absence), so that trace
    stops with one line. Eagerly the key is stored as None, for a later trace."""
    if key not in config.__dict__:
        if tracing():
            raise ValueError(f"{type(config).__name__} has no {key} entry, so a compiled model could not see it set "
                             "later: build the model with attn_implementation='dilcompile_...' after register() (or "
                             f"switch it with model.set_attn_implementation), or set config.{key} (None for the "
                             "default) before compiling")
        config.__dict__[key] = None
    return config.__dict__[key]


def _required(config, key: str, example: str):
    value = _value(config, key)
    if value is None:
        raise ValueError(f"the model config has no {key}; set it with dilcompile.integrations.transformers."
                         f"configure(model, ...) or config.{key} = {example}")
    # Checked when set; checked again eagerly for values put in a config's __dict__ directly
    # (not under a trace, which cannot run the pattern parser).
    return value if tracing() else CHECKS[key](key, value)


def configure(target, *, segment_lengths=None, dilation_rates=None, mode=None, pattern=None, block_size=None):
    """Set and check the ``dilcompile_*`` keys of a model or config; returns ``target``.

    ``target`` is a transformers ``PreTrainedConfig`` or model (then every
    config its modules hold — a composite model's sub-configs too — gets
    the keys). Each value is checked here, and the dilated keys together
    (one dilation rate per segment length), so a bad value fails now, not
    at the first forward. Arguments left None are not changed.

    Args:
        segment_lengths, dilation_rates: lists of positive ints, one per
            branch (``"dilcompile_dilated"``).
        mode: "longnet" (default) or "groups".
        pattern: a pattern spec string (``"dilcompile_block_sparse"``).
        block_size: tokens per block (block-sparse, default 128).
    """
    from transformers import PreTrainedConfig

    values = {"dilcompile_segment_lengths": segment_lengths, "dilcompile_dilation_rates": dilation_rates,
              "dilcompile_mode": mode, "dilcompile_pattern": pattern, "dilcompile_block_size": block_size}
    values = {key: CHECKS[key](key, value) for key, value in values.items() if value is not None}
    if isinstance(target, PreTrainedConfig):
        configs = [target]
    elif hasattr(target, "modules") and isinstance(getattr(target, "config", None), PreTrainedConfig):
        configs = list({id(c): c for c in (getattr(m, "config", None) for m in target.modules())
                        if isinstance(c, PreTrainedConfig)}.values())
    else:
        raise TypeError(f"configure takes a transformers model or PreTrainedConfig, got {type(target).__name__}")
    for config in configs:
        for key, value in values.items():
            config.__dict__[key] = value  # checked above; also right before register() installs the keys
        if config.__dict__.get("dilcompile_segment_lengths") is not None \
                or config.__dict__.get("dilcompile_dilation_rates") is not None:
            check_branches_of(config)
    return target
