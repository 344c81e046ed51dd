"""``template(pattern)``: a pattern split into its structure (its spec with
every int replaced by ``_i``, every float by ``_f``) and its numbers, so the
attention op can take the numbers as a tensor: a changed window or seed then
reuses the compiled graph. ``spec.from_template`` is the inverse.

Reads only ``repr(pattern)`` (a spec of itself), so the pattern protocol can
call it at construction without importing the patterns.
"""

from __future__ import annotations

import ast


class _Hole(ast.NodeTransformer):
    def __init__(self):
        self.numbers: list = []

    def visit_Constant(self, node):  # noqa: N802
        if isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
            self.numbers.append(node.value)
            return ast.Name(id="_i" if isinstance(node.value, int) else "_f", ctx=ast.Load())
        return node


def template(pattern) -> tuple[str, list]:
    """(structure spec with ints as ``_i`` and floats as ``_f``, the numbers in order)."""
    tree = ast.parse(repr(pattern), mode="eval")
    holes = _Hole()
    tree = holes.visit(tree)
    return ast.unparse(tree), holes.numbers
