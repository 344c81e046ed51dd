"""Our Inductor graph passes, their on/off switches, and their cache key.

``enable()`` puts one ``DilcompilePass`` into Inductor's post-grad custom-pass
slot (``torch._inductor.config.post_grad_custom_post_pass``); it runs each
enabled pass of ``PASSES`` in order and then the pass the slot held before.
``disable()`` puts that previous pass back. Nothing happens at import.

Cache key: Inductor does not key its FX-graph cache on third-party code, but it
does put a custom pass's ``uuid()`` into the key. Ours is a hash of every file
that can change a graph we compile (``SOURCES``: passes, rewrites, lowering,
the custom and Triton ops, kernels, patterns), computed once per process, plus
the on/off switches and the chained pass's uuid — so an upgrade of these
files, or a switch flipped, is never served a stale compiled graph.

Private-API guards (torch 2.11 … 2.13): the custom-pass slot and
``CustomGraphPass`` are looked up defensively; a torch without them runs
without our passes (``enable()`` returns False) instead of failing.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
from pathlib import Path

import torch

from .rewrite_block_sparse import rewrite_block_sparse
from .rewrite_dilated import rewrite_dilated

# name → pass(graph); run in this order
PASSES = {"rewrite_dilated": rewrite_dilated, "rewrite_block_sparse": rewrite_block_sparse}
_enabled = {name: True for name in PASSES}
_PKG = Path(__file__).resolve().parent.parent
# Everything whose change can change a compiled graph (globs under the package root).
SOURCES = (
    "compiler/passes.py", "compiler/rewrite_dilated.py", "compiler/rewrite_block_sparse.py", "compiler/lowering.py",
    "numerics.py", "dilated/ops.py", "dilated/triton_ops.py", "dilated/decode_ops.py", "dilated/geometry.py",
    "dilated/work.py", "dilated/impl/*.py", "block_sparse/ops.py", "block_sparse/impl/*.py", "distributed/ops.py",
    "kernels/*.py", "patterns/*.py", "varlen.py", "dilated/varlen_ops.py", "dilated/dispatch.py",
    "block_sparse/varlen_ops.py", "block_sparse/dispatch.py",
)


def source_files(root: Path = _PKG) -> tuple[Path, ...]:
    """The files ``SOURCES`` names under ``root``, in a fixed order."""
    return tuple(sorted({path for pattern in SOURCES for path in root.glob(pattern)}))


def hash_sources(root: Path = _PKG) -> str:
    """sha256 (hex, 16 chars) over the relative path and bytes of each source file under ``root``."""
    h = hashlib.sha256()
    for path in source_files(root):
        h.update(path.relative_to(root).as_posix().encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


@functools.cache
def source_hash() -> str:
    """``hash_sources()`` of this installation, computed once per process."""
    return hash_sources()


def set_pass(name: str, enabled: bool) -> None:
    """Switch one pass on or off (takes effect for graphs compiled afterwards)."""
    if name not in PASSES:
        raise ValueError(f"unknown pass {name!r}; passes are {sorted(PASSES)}")
    if not isinstance(enabled, bool):
        raise TypeError(f"enabled must be a bool, got {enabled!r}")
    _enabled[name] = enabled


def enabled_passes() -> dict[str, bool]:
    return dict(_enabled)


@contextlib.contextmanager
def switches(**flags: bool):
    """``with switches(rewrite_dilated=False): ...`` — temporary on/off switches."""
    old = dict(_enabled)
    try:
        for name, on in flags.items():
            set_pass(name, on)
        yield
    finally:
        _enabled.update(old)


def _cache_tag() -> str:
    """Our part of the FX-graph cache key: source hash and switches."""
    return f"dilcompile-{source_hash()}-" + "".join("1" if _enabled[n] else "0" for n in PASSES)


try:
    from torch._inductor.custom_graph_pass import CustomGraphPass as _Base
except ImportError:  # older/newer torch without the interface: plain callables are accepted
    _Base = object


class DilcompilePass(_Base):
    """Runs the enabled dilcompile passes, then the pass the slot held before."""

    def __init__(self, previous=None):
        self.previous = previous

    def __call__(self, graph: torch.fx.Graph, *args, **kwargs) -> None:
        for name, fn in PASSES.items():
            if _enabled[name]:
                fn(graph)
        if self.previous is not None:
            self.previous(graph, *args, **kwargs)

    def uuid(self):
        prev = getattr(self.previous, "uuid", lambda: None)() if self.previous is not None else None
        return _cache_tag() + ("" if prev is None else f"+{prev!r}")


_SLOT = "post_grad_custom_post_pass"


def _inductor_config():
    from torch._inductor import config

    return config


def install_pass() -> bool:
    """Put ``DilcompilePass`` into Inductor's post-grad slot, chaining what the
    slot held (idempotent). False where this torch has no such slot."""
    config = _inductor_config()
    if not hasattr(config, _SLOT):
        return False
    current = getattr(config, _SLOT)
    if not isinstance(current, DilcompilePass):
        setattr(config, _SLOT, DilcompilePass(current))
    return True


def uninstall_pass() -> None:
    """Give the slot back the pass it held before ``install_pass()`` (no-op if ours is not there)."""
    config = _inductor_config()
    current = getattr(config, _SLOT, None)
    if isinstance(current, DilcompilePass):
        setattr(config, _SLOT, current.previous)
    elif _chained(current):
        raise RuntimeError(f"Inductor's {_SLOT} was replaced after dilcompile.compiler.enable() by {current!r}, "
                           "which chains our pass; restore that slot before calling dilcompile.compiler.disable()")


def _chained(graph_pass) -> bool:
    while graph_pass is not None:
        if isinstance(graph_pass, DilcompilePass):
            return True
        graph_pass = getattr(graph_pass, "previous", None)
    return False


def pass_installed() -> bool:
    return isinstance(getattr(_inductor_config(), _SLOT, None), DilcompilePass)
