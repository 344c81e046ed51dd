"""One factory over every attention kind, with one config vocabulary.

    create_attention(kind, **config)            -> (B, H, N, D) module
    create_multihead_attention(kind, **config)  -> (B, N, E) module, nn.MultiheadAttention call shape

(``create_dilated_attention`` and ``create_multihead_dilated_attention`` are
their former names, kept as deprecated aliases: the kinds are not all dilated.)

The config keys are the same for every kind (a kind rejects, by name, the keys
it does not take): ``segment_lengths``, ``dilation_rates``, ``causal``,
``scale``, ``impl``, ``pattern`` (block-sparse), ``mode`` (only to say what
``"auto"`` must compute); multihead adds ``embed_dim``, ``num_heads``,
``dropout``, ``bias``, ``sub_ln``, ``gamma_init``, ``device``, ``dtype``.
Input *hints* — ``seq_len``, ``num_heads``, ``head_dim``, ``dtype``,
``device``, ``training`` — describe the input; only ``kind="auto"`` reads them.

Kinds live in a registry (:func:`register_kind`); adding one is one call.
A kind's measured runs are the run store's rows whose ``variant`` (the
profiler's name, :mod:`dilcompile.profile.variants`) is the kind's name, or
starts with ``<kind>:``; the built-in names that both registries use are
spelled once, in :mod:`dilcompile.variant_names`.
Registered: ``"dilated"``, ``"dilated-groups"``, ``"block-sparse"`` (config key
``pattern``: a ``dilcompile.patterns`` pattern or spec string) and ``"ring"``
(sequence-parallel dilated attention on each rank's shard; only with an
initialised process group of more than one rank).

``kind="auto"`` never changes *what* is computed: it picks among the
registered kinds that compute the requested attention (``pattern`` given →
block-sparse; otherwise dilated with ``mode``, default "longnet") and can serve
the input, and among their backends (``impl``):

1. **Measured**: if the run store (``store=``, a path; default the store's
   own default, ``runs/dilcompile.duckdb`` under the working directory; read
   through :mod:`dilcompile.store`, view ``runs``) has ``status='ok'`` rows for this device, dtype, seq_len, heads, head_dim
   (and causal, pass and segment config where recorded) for a candidate, the
   (kind, impl) with the lowest measured median latency wins.
2. **Rule** otherwise (no file, no view, no matching rows, or no seq_len
   hint): the usable candidate of highest ``priority`` (ring kinds rank
   above single-device ones and are usable only with an active process
   group), with ``impl="auto"``.

``explain=True`` returns ``(module, Choice)``; ``Choice.reason`` says why.
"""

from __future__ import annotations

import inspect
import json
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from .block_sparse import BlockSparseAttention, MultiheadBlockSparseAttention
from .block_sparse.config import IMPLS as BLOCK_SPARSE_IMPLS
from .dilated import DilatedAttention
from .dilated.config import IMPLS
from .distributed import RingDilatedAttention, RingMultiheadDilatedAttention
from .kernels import backend_for
from .multihead import MultiheadDilatedAttention
from .variant_names import BLOCK_SPARSE, DILATED, DILATED_GROUPS

# How long "auto" waits for a store another process holds (a sweep holds it one point at a time).
STORE_TIMEOUT_S = 10.0
HINTS = ("seq_len", "num_heads", "head_dim", "dtype", "device", "training")


@dataclass(frozen=True)
class Kind:
    """One registered kind of attention module.

    ``attention(**config)`` and ``multihead(**config)`` build the modules
    (keyword-only parameters = the config keys the kind takes). ``computes``
    names the function computed — kinds with equal ``computes`` are
    interchangeable for ``"auto"``. ``unusable(hints)`` returns why the kind
    cannot serve an input (None if it can). ``impls()`` lists the backends
    ``impl=`` accepts, for ``"auto"`` to choose among.
    """

    name: str  # what kind= takes; also the profiler variant whose runs measure it
    computes: str  # "dilated:longnet" | "dilated:groups" | "block-sparse" | ...
    attention: Callable[..., nn.Module]
    multihead: Callable[..., nn.Module]
    priority: int = 0  # the rule's preference among usable candidates
    unusable: Callable[[dict], str | None] = field(default=lambda hints: None)
    impls: Callable[[], tuple[str, ...]] = field(default=lambda: ("auto",))


_REGISTRY: dict[str, Kind] = {}


def register_kind(kind: Kind, *, replace: bool = False) -> None:
    if kind.name == "auto" or (kind.name in _REGISTRY and not replace):
        raise ValueError(f"kind {kind.name!r} is reserved or already registered (replace=True to override)")
    _REGISTRY[kind.name] = kind


def kinds() -> tuple[str, ...]:
    return tuple(_REGISTRY)


def process_group_active() -> bool:
    """True if torch.distributed is initialised with more than one rank (ring kinds need it)."""
    dist = torch.distributed
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


# -- the dilated kinds ----------------------------------------------------------------------------

def _kernel_unusable(hints: dict) -> str | None:
    if hints.get("head_dim") is None or hints.get("device") is None:
        return None
    try:
        backend_for(torch.device(hints["device"]), _dtype(hints.get("dtype")) or torch.float32, hints["head_dim"])
    except ValueError as err:
        return str(err)
    return None


def _dilated_kind(kind: str, mode: str) -> Kind:
    def attention(*, segment_lengths, dilation_rates, causal=False, scale=None, impl="auto"):
        return DilatedAttention(segment_lengths, dilation_rates, causal=causal, mode=mode, scale=scale, impl=impl)

    def multihead(*, embed_dim, num_heads, segment_lengths, dilation_rates, dropout=0.0, bias=True, sub_ln=True,
                  gamma_init=1.0, scale=None, impl="auto", device=None, dtype=None):
        return MultiheadDilatedAttention(embed_dim, num_heads, segment_lengths, dilation_rates, dropout=dropout,
                                         bias=bias, sub_ln=sub_ln, mode=mode, device=device, dtype=dtype,
                                         gamma_init=gamma_init, scale=scale, impl=impl)

    # impl="reference" is the float64 oracle, never a speed choice.
    return Kind(kind, f"dilated:{mode}", attention, multihead, unusable=_kernel_unusable,
                   impls=lambda: tuple(i for i in IMPLS if i != "reference"))


register_kind(_dilated_kind(DILATED, "longnet"))
register_kind(_dilated_kind(DILATED_GROUPS, "groups"))


# -- block-sparse ---------------------------------------------------------------------------------

def _block_sparse_attention(*, pattern, causal=False, scale=None, impl="auto", block_size=128):
    return BlockSparseAttention(pattern, causal=causal, scale=scale, impl=impl, block_size=block_size)


def _block_sparse_multihead(*, embed_dim, num_heads, pattern, dropout=0.0, bias=True, sub_ln=True, gamma_init=1.0,
                            scale=None, impl="auto", block_size=128, device=None, dtype=None):
    return MultiheadBlockSparseAttention(embed_dim, num_heads, pattern, dropout=dropout, bias=bias, sub_ln=sub_ln,
                                         gamma_init=gamma_init, scale=scale, impl=impl, block_size=block_size,
                                         device=device, dtype=dtype)


register_kind(Kind(BLOCK_SPARSE, "block-sparse", _block_sparse_attention, _block_sparse_multihead,
                         impls=lambda: tuple(i for i in BLOCK_SPARSE_IMPLS if i != "reference")))


# -- ring (sequence parallel): each rank passes its shard -------------------------------------------

def _ring_unusable(hints: dict) -> str | None:
    if not process_group_active():
        return ("needs an initialised torch.distributed process group with more than one rank "
                "(torch.distributed.init_process_group, e.g. under torchrun)")
    return _kernel_unusable(hints)


def _ring_attention(*, segment_lengths, dilation_rates, causal=False, scale=None, impl="auto"):
    return RingDilatedAttention(segment_lengths, dilation_rates, causal=causal, scale=scale, impl=impl)


def _ring_multihead(*, embed_dim, num_heads, segment_lengths, dilation_rates, dropout=0.0, bias=True, sub_ln=True,
                    gamma_init=1.0, scale=None, device=None, dtype=None):
    return RingMultiheadDilatedAttention(embed_dim, num_heads, segment_lengths, dilation_rates, dropout=dropout,
                                         bias=bias, sub_ln=sub_ln, device=device, dtype=dtype, gamma_init=gamma_init,
                                         scale=scale)


register_kind(Kind("ring", "dilated:longnet", _ring_attention, _ring_multihead, priority=10,
                         unusable=_ring_unusable, impls=lambda: ("auto", "sdpa")))


# -- choosing ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Choice:
    kind: str
    impl: str
    source: str  # "store" | "rule" | "explicit"
    reason: str
    measured: tuple[tuple[str, str, float, int], ...] = ()  # (variant, impl, best median ms, rows)

    def __str__(self) -> str:
        return f"{self.kind} (impl={self.impl}, {self.source}): {self.reason}"


def _dtype(value) -> torch.dtype | None:
    if value is None or isinstance(value, torch.dtype):
        return value
    dtype = getattr(torch, str(value).removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"dtype {value!r} is not a torch dtype name such as 'float16'")
    return dtype


def device_name(device) -> str:
    """The ``device`` string the run store records: the CUDA device name or the CPU model."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    from .profile.env import cpu_model  # the profiler (and its store) load only when "auto" reads the store

    return cpu_model()


def _measured(store: Path, hints: dict, config: dict, candidates: list[str]):
    """Fastest measured (variant, impl, ms, rows) per candidate, or (None, why not).
    Read through :mod:`dilcompile.store` (its lock retries and damage checks)."""
    from .store import StoreError, query  # the store (and duckdb) load only when "auto" reads it

    try:
        import duckdb
    except ImportError:
        return None, "duckdb is not installed (pip install 'dilcompile[store]')"
    try:
        columns = {row[0] for row in query(store, "DESCRIBE runs", timeout=STORE_TIMEOUT_S)[1]}
    except StoreError as err:  # no file, damaged, locked for longer than the timeout, too new
        return None, f"run store {store} cannot be read ({err})" if store.exists() else f"no run store at {store}"
    except duckdb.Error:
        return None, f"run store {store} has no 'runs' view"
    need = {"variant", "impl", "device", "dtype", "seq_len", "heads", "head_dim", "latency_ms", "status"}
    if not need <= columns:
        return None, f"'runs' in {store} lacks columns {sorted(need - columns)}"
    dtype = str(_dtype(hints.get("dtype")) or torch.float32).removeprefix("torch.")
    where = ["status = 'ok'", "latency_ms IS NOT NULL", "device = ?", "dtype IN (?, ?)", "seq_len = ?",
             "heads = ?", "head_dim = ?"]
    args = [device_name(hints.get("device") or "cpu"), dtype, f"torch.{dtype}", hints["seq_len"],
            hints["num_heads"], hints["head_dim"]]
    if "causal" in columns and "causal" in config:
        where.append("causal = ?")
        args.append(bool(config["causal"]))
    if "pass" in columns:
        where.append('"pass" = ?')
        args.append("fwd_bwd" if hints.get("training") else "fwd")
    where.append("(" + " OR ".join("variant = ? OR variant LIKE ?" for _ in candidates) + ")")
    for kind in candidates:
        args += [kind, f"{kind}:%"]
    cfg = ", config" if "config" in columns else ", NULL"
    try:
        _, rows = query(store, f"SELECT variant, impl, latency_ms{cfg} FROM runs WHERE {' AND '.join(where)}", args,
                        timeout=STORE_TIMEOUT_S)
    except StoreError as err:
        return None, f"run store {store} cannot be read ({err})"
    best: dict[tuple[str, str], list] = {}
    for variant, impl, ms, cfg_text in rows:
        if not _same_branches(cfg_text, config):
            continue
        entry = best.setdefault((variant.split(":", 1)[0], impl or "auto"), [float("inf"), 0])
        entry[0], entry[1] = min(entry[0], float(ms)), entry[1] + 1
    if not best:
        return None, (f"no ok rows in {store} for device={args[0]!r}, dtype={dtype}, seq_len={hints['seq_len']}, "
                      f"heads={hints['num_heads']}, head_dim={hints['head_dim']} among {candidates}")
    return sorted((v, i, ms, n) for (v, i), (ms, n) in best.items()), None


def _same_branches(cfg_text, config: dict) -> bool:
    """Rows recorded with another segment/rate config measure another problem."""
    if not cfg_text:
        return True
    try:
        cfg = json.loads(cfg_text)
    except (TypeError, ValueError):
        return True
    for key, ours in (("segments", "segment_lengths"), ("rates", "dilation_rates")):
        if key in cfg and ours in config and list(cfg[key]) != list(config[ours]):
            return False
    return True


def choose(config: dict, hints: dict, store: Path | str | None = None) -> Choice:
    """The (kind, impl) ``"auto"`` picks for ``config`` and the input described by ``hints``."""
    wanted = "block-sparse" if "pattern" in config else f"dilated:{config.get('mode', 'longnet')}"
    family = [v for v in _REGISTRY.values() if v.computes == wanted]
    if not family:
        raise ValueError(f"no registered kind computes {wanted!r}; registered: {kinds()}")
    usable, refused = [], []
    for v in family:
        why = v.unusable(hints)
        (refused.append(f"{v.name}: {why}") if why else usable.append(v))
    if not usable:
        raise ValueError(f"no kind computing {wanted!r} can serve this input: {'; '.join(refused)}")
    note = f" (not usable: {'; '.join(refused)})" if refused else ""
    if hints.get("seq_len") is None or hints.get("num_heads") is None or hints.get("head_dim") is None:
        measured, why = None, "no seq_len/num_heads/head_dim hints to match measured runs"
    else:
        if store is None:
            from .store import DEFAULT_DB  # the store loads only when "auto" reads it

            store = DEFAULT_DB
        store = Path(store)
        measured, why = _measured(store, hints, config, [v.name for v in usable])
    if measured:
        fixed = config.get("impl", "auto")  # an impl the caller named is kept
        allowed = [m for m in measured if m[1] in _REGISTRY[m[0]].impls() and fixed in ("auto", m[1])]
        if allowed:
            kind, impl, ms, n = min(allowed, key=lambda m: m[2])
            return Choice(kind, impl, "store", f"fastest measured for {wanted}: {ms:.3f} ms median over {n} "
                          f"run(s) in {store}{note}", tuple(measured))
        why = f"measured impls {[m[1] for m in measured]} are not selectable"
    best = max(usable, key=lambda v: v.priority)
    return Choice(best.name, "auto", "rule", f"{why}; rule: highest-priority usable kind computing {wanted}{note}")


# -- the factories ---------------------------------------------------------------------------------

def _build(builder_of: str, kind: str, config: dict, hints: dict, explain: bool, store):
    if kind == "auto":
        choice = choose(config, hints, store)
        if choice.impl != "auto":
            config = {**config, "impl": choice.impl}
        kind = choice.kind
    elif kind in _REGISTRY:
        why = _REGISTRY[kind].unusable(hints) if kind == "ring" else None
        if why:  # a ring module built without a group would fail only at its first forward
            raise ValueError(f"kind 'ring' {why}; on one device use kind='dilated'")
        choice = Choice(kind, config.get("impl", "auto"), "explicit", "kind given by the caller")
    else:
        raise ValueError(f"kind must be 'auto' or one of {kinds()}, got {kind!r}")
    config = {k: v for k, v in config.items() if k != "mode"}  # the kind fixes the mode
    builder = getattr(_REGISTRY[kind], builder_of)
    params = inspect.signature(builder).parameters
    unknown = sorted(set(config) - set(params))
    if unknown:
        raise TypeError(f"kind {kind!r} takes no {unknown}; its config keys are {sorted(params)} "
                        f"(input hints: {list(HINTS)})")
    module = builder(**config)
    return (module, choice) if explain else module


def _check_mode(kind: str, config: dict) -> None:
    mode = config.get("mode")
    v = _REGISTRY.get(kind)
    if mode is not None and v is not None and v.computes.startswith("dilated:") and v.computes != f"dilated:{mode}":
        raise ValueError(f"mode={mode!r} contradicts kind {kind!r} (which computes {v.computes}); "
                         "drop mode or pick the matching kind")


def create_attention(kind: str = "auto", *, explain: bool = False, store=None, **config):
    """A (B, H, N, D) attention module of ``kind`` ("auto" or one of :func:`kinds`).
    Hints (seq_len, num_heads, head_dim, dtype, device, training) only steer "auto",
    which may read measured runs from ``store`` (a run-store path).
    With ``explain=True`` returns ``(module, Choice)``."""
    hints = {k: config.pop(k) for k in HINTS if k in config}
    _check_mode(kind, config)
    return _build("attention", kind, config, hints, explain, store)


def create_multihead_attention(kind: str = "auto", *, explain: bool = False, store=None, **config):
    """A (B, N, E) multihead module of ``kind``; ``embed_dim`` and ``num_heads``
    are required. Hints (seq_len, training) only steer "auto"."""
    for key in ("embed_dim", "num_heads"):
        if key not in config:
            raise TypeError(f"create_multihead_attention needs {key}=")
    hints = {k: config.pop(k) for k in ("seq_len", "training") if k in config}
    hints.update(num_heads=config["num_heads"], head_dim=config["embed_dim"] // config["num_heads"],
                 dtype=config.get("dtype"), device=config.get("device") or "cpu")
    _check_mode(kind, config)
    return _build("multihead", kind, config, hints, explain, store)


def _renamed(old: str, new):
    """``old``: a deprecated alias of ``new`` that warns at each call site."""
    def alias(*args, **kwargs):
        warnings.warn(f"dilcompile.{old} is deprecated: use dilcompile.{new.__name__} (same arguments); it builds "
                      "every kind, block-sparse included", DeprecationWarning, stacklevel=2)
        return new(*args, **kwargs)

    alias.__name__ = alias.__qualname__ = old
    alias.__doc__ = f"Deprecated alias of :func:`{new.__name__}`."
    return alias


create_dilated_attention = _renamed("create_dilated_attention", create_attention)
create_multihead_dilated_attention = _renamed("create_multihead_dilated_attention", create_multihead_attention)
