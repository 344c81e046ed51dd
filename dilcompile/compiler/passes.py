"""Our Inductor graph passes, their on/off switches, and the FX-graph cache tag.

``install()`` (called when ``dilcompile.compiler`` is imported) puts one
``CustomGraphPass`` into Inductor's post-grad custom-pass slot; it runs each
enabled pass of ``PASSES`` in order and chains whatever pass the slot already
held. Its ``uuid()`` — part of Inductor's FX-graph cache key — hashes our
pass and lowering sources plus the on/off switches, and the same hash is
appended to ``torch.compiler.config.cache_key_tag``: Inductor does not key its
cache on third-party code, so without this an upgrade of these files (or a
switch flipped) would be served a stale compiled graph.

Private-API guards (torch 2.11 … 2.13): the custom-pass slot and
``CustomGraphPass`` are looked up defensively; a torch without them runs
without our passes (``installed()`` says so) instead of failing at import.
"""

from __future__ import annotations

import contextlib
import hashlib
from pathlib import Path

import torch

from .rewrite import rewrite_dilated
from .rewrite_mask import rewrite_block_sparse

# name → pass(graph); run in this order
PASSES = {"rewrite_dilated": rewrite_dilated, "rewrite_block_sparse": rewrite_block_sparse}
_enabled = {name: True for name in PASSES}
_PKG = Path(__file__).resolve().parent.parent
# Everything whose change must invalidate a cached compiled graph.
SOURCES = (
    "compiler/ops.py", "compiler/passes.py", "compiler/rewrite.py", "compiler/rewrite_mask.py",
    "compiler/triton_ops.py", "block_sparse/ops.py",
    "dilated/geometry.py", "dilated/impl/sdpa.py", "dilated/impl/triton.py",
    "kernels/attention.py", "kernels/triton_dilated.py",
)


def source_hash() -> str:
    """sha256 (hex, 16 chars) of our lowering/pass sources."""
    h = hashlib.sha256()
    for rel in SOURCES:
        path = _PKG / rel
        h.update(rel.encode())
        h.update(path.read_bytes() if path.exists() else b"<missing>")
    return h.hexdigest()[:16]


def set_pass(name: str, enabled: bool) -> None:
    """Switch one pass on or off (takes effect for graphs compiled afterwards)."""
    if name not in PASSES:
        raise ValueError(f"unknown pass {name!r}; passes are {sorted(PASSES)}")
    if not isinstance(enabled, bool):
        raise TypeError(f"enabled must be a bool, got {enabled!r}")
    _enabled[name] = enabled
    update_cache_tag()


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
        update_cache_tag()


def _cache_tag() -> str:
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


def install() -> bool:
    """Put our pass into Inductor's post-grad slot and tag the FX-graph cache
    (idempotent). Returns False where this torch has no such slot."""
    from torch._inductor import config as inductor_config

    if not hasattr(inductor_config, _SLOT):
        return False
    current = getattr(inductor_config, _SLOT)
    if not isinstance(current, DilcompilePass):
        setattr(inductor_config, _SLOT, DilcompilePass(current))
    update_cache_tag()
    return True


def installed() -> bool:
    from torch._inductor import config as inductor_config

    return isinstance(getattr(inductor_config, _SLOT, None), DilcompilePass)


def update_cache_tag() -> None:
    """Append our source hash and switches to ``torch.compiler.config.cache_key_tag``
    (keeping a tag the user set)."""
    cconfig = getattr(torch.compiler, "config", None)
    if cconfig is None or not hasattr(cconfig, "cache_key_tag"):
        return
    user = [t for t in (cconfig.cache_key_tag or "").split("|") if t and not t.startswith("dilcompile-")]
    cconfig.cache_key_tag = "|".join(user + [_cache_tag()])
