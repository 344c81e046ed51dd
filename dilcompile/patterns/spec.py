"""``from_spec("local_window(window=256)")``: patterns from short strings.

A spec is a call expression: a pattern name, keyword (or positional)
arguments that are numbers or tuples of numbers, and nested patterns for the
combinators — ``"union(local_window(64), random_blocks(density=0.05))"``.
Omitted arguments take the pattern's defaults; a bare name (``"dilated"``)
is the pattern with all defaults. ``repr(pattern)`` is a spec of itself.

``from_template`` is the inverse of ``template.template`` (a pattern's
structure and numbers, the attention op's arguments).
"""

from __future__ import annotations

import ast
import functools

from ..tracing import tracing
from .adaptive import adaptive
from .base import Pattern
from .combinators import causal, intersection, union
from .dilated import dilated
from .global_local import global_local
from .hierarchical import hierarchical
from .hilbert import hilbert
from .local_window import local_window
from .random_blocks import random_blocks
from .template import template

PATTERNS = {p.name: p for p in (local_window, dilated, global_local, random_blocks, hierarchical, adaptive,
                                hilbert, union, intersection, causal)}
PATTERN_NAMES = tuple(PATTERNS)
__all__ = ["PATTERNS", "PATTERN_NAMES", "from_spec", "from_template", "own_pattern", "template"]


def _value(node: ast.AST, numbers: list | None):
    if isinstance(node, ast.Call):
        return _call(node, numbers)
    if isinstance(node, (ast.Tuple, ast.List)):
        return tuple(_value(e, numbers) for e in node.elts)
    if isinstance(node, ast.Name) and node.id in ("_i", "_f") and numbers is not None:
        value = numbers.pop(0)  # numbers travel as float64: ints are exact up to 2^53
        return int(value) if node.id == "_i" else float(value)
    if isinstance(node, ast.Name) and node.id in PATTERNS:
        return PATTERNS[node.id]()
    if isinstance(node, ast.Constant) and (node.value is None or isinstance(node.value, (int, float, str, bool))):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_value(node.operand, numbers)
    raise ValueError(f"pattern spec: cannot read {ast.unparse(node)!r}; use numbers, tuples, strings or patterns")


def _call(node: ast.Call, numbers: list | None) -> Pattern:
    if not isinstance(node.func, ast.Name) or node.func.id not in PATTERNS:
        name = ast.unparse(node.func)
        raise ValueError(f"unknown pattern {name!r} in spec; known patterns: {', '.join(PATTERN_NAMES)}")
    args = [_value(a, numbers) for a in node.args]
    names = [kw.arg for kw in node.keywords]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:  # ast reads f(w=1, w=2), which Python itself refuses; the stored name would be ambiguous
        raise ValueError(f"pattern spec {ast.unparse(node)!r}: keyword {', '.join(repeated)} given twice")
    kwargs = {kw.arg: _value(kw.value, numbers) for kw in node.keywords}
    try:
        return PATTERNS[node.func.id](*args, **kwargs)
    except TypeError as err:
        raise ValueError(f"pattern spec {ast.unparse(node)!r}: {err}") from err


_PARSED: dict[str, Pattern] = {}  # spec → pattern, so a compiled region can look a parsed spec up
_PARSED_MAX = 1024


def from_spec(spec: str) -> Pattern:
    """A pattern from a spec string such as ``"dilated(segment_lengths=(2048,4096),dilation_rates=(1,2))"``."""
    if isinstance(spec, Pattern):
        return spec
    if not isinstance(spec, str) or not spec.strip():
        raise TypeError(f"spec must be a non-empty string such as 'local_window(window=256)', got {spec!r}")
    if spec in _PARSED:
        return _PARSED[spec]
    try:
        tree = ast.parse(spec.strip(), mode="eval").body
    except SyntaxError as err:
        raise ValueError(f"pattern spec {spec!r} is not a call expression like 'local_window(window=256)'") from err
    pattern = _value(tree, None) if isinstance(tree, (ast.Name, ast.Call)) else _bad(spec)
    if len(_PARSED) >= _PARSED_MAX:
        _PARSED.clear()
    _PARSED[spec] = pattern
    return pattern


def own_pattern(spec: str) -> Pattern:
    """``from_spec`` for a module to keep. A data-dependent pattern (``adaptive``)
    is an ``nn.Module`` with parameters: each module gets one built anew, so two
    modules made from one spec train scorers of their own instead of sharing
    the cached one. Other patterns are values, and are shared."""
    pattern = from_spec(spec)
    return _value(ast.parse(spec.strip(), mode="eval").body, None) if pattern.data_dependent else pattern


def parsed_spec(spec: str) -> Pattern:
    """``from_spec`` inside torch.compile: the parser (``ast``) cannot be traced,
    so the spec must have been parsed once outside (any eager call with it
    does, as does ``from_spec(spec)``)."""
    if spec not in _PARSED:
        raise ValueError(f"pattern spec {spec!r} inside torch.compile: parse it outside first — pass "
                         f"from_spec({spec!r}) (a pattern object) or call once eagerly with the string")
    return _PARSED[spec]


def _bad(spec):
    raise ValueError(f"pattern spec {spec!r} must be a pattern name or call, e.g. 'local_window(window=256)'")


def from_template(structure: str, numbers: tuple) -> Pattern:
    """Inverse of :func:`template` (cached). Built while this thread traces (a
    function Dynamo calls for a constant, such as decode's block bound), a
    pattern has no op arguments (``Pattern._finish``): it is not cached, or an
    eager op rebuilding the same pattern later would be handed it."""
    if tracing():
        return _from_template.__wrapped__(structure, numbers)
    return _from_template(structure, numbers)


@functools.lru_cache(maxsize=256)
def _from_template(structure: str, numbers: tuple) -> Pattern:
    return _value(ast.parse(structure, mode="eval").body, list(numbers))
