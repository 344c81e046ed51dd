"""Eager calls while another thread is inside torch.compile (dilcompile/tracing.py).

``torch.compiler.is_compiling()`` is one flag for the process: with a compile
held open in one thread, eager calls in another were refused (block-sparse
``impl="flex"``: "inside torch.compile needs its BlockMask"; a new pattern spec
string: "parse it outside first") or skipped checks (``LongNetDecoder`` passed
its ``max_seq_len`` check and failed in the position table with an IndexError).
A serving process compiles in one thread while others serve."""

import threading

import pytest
import torch

from dilcompile import block_sparse_attention
from dilcompile.models import LongNetConfig, LongNetDecoder
from dilcompile.patterns import local_window
from dilcompile.tracing import symbolic, tracing

_TORCH = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])


@pytest.fixture
def compile_held_open():
    """A thread inside torch.compile's trace until the test ends. No wait has a time limit: the trace
    is held for as long as the test takes, and pytest's --timeout guards against a hang (a limit in
    seconds here failed on a busy machine, or let the trace go on before the test was done)."""
    entered, release = threading.Event(), threading.Event()

    @torch._dynamo.assume_constant_result
    def hold() -> int:  # Dynamo calls it for real while tracing: the trace waits here
        entered.set()
        release.wait()
        return 1

    def traced(x):
        return x + hold()

    result = {}

    def compile_():
        try:
            result["out"] = torch.compile(traced, fullgraph=True)(torch.zeros(2))
        except BaseException as exc:
            result["error"] = exc
        finally:
            entered.set()  # a compile that failed before reaching hold() does not leave the test waiting

    worker = threading.Thread(target=compile_, daemon=True)
    worker.start()
    entered.wait()
    try:
        assert worker.is_alive(), f"the compile ended before its trace reached hold(): {result}"
        # The process-wide flag the eager calls below used to read: torch 2.13 holds it through the
        # whole compile; 2.11 sets it only while the compiled graph runs.
        assert torch.compiler.is_compiling() or _TORCH < (2, 13)
        yield
    finally:
        release.set()
        worker.join()
    assert "error" not in result, result
    assert torch.equal(result["out"], torch.ones(2))  # and the held compile itself still worked


@pytest.fixture
def warm_flex():
    """impl="flex" runs a compiled kernel, and compiles take one lock for the process: warm it first
    (a compile in another thread would make this one wait, not fail), then drop its BlockMask, which
    an eager call builds again and a traced one must find prepared."""
    from dilcompile.block_sparse import cache

    q, k, v = (torch.randn(1, 2, 96, 16) for _ in range(3))  # three tensors, as below: no aliasing guard fails
    with torch.no_grad():  # flex on CPU is inference-only
        block_sparse_attention(q, k, v, local_window(8), causal=True, impl="flex", block_size=32)
    cache.clear()


def test_eager_calls_in_other_threads_are_not_taken_for_traced_ones(warm_flex, compile_held_open):
    q, k, v = (torch.randn(1, 2, 96, 16) for _ in range(3))
    with torch.no_grad():
        flex = block_sparse_attention(q, k, v, local_window(8), causal=True, impl="flex", block_size=32)
    gather = block_sparse_attention(q, k, v, "local_window(window=8)", causal=True, impl="gather", block_size=32)
    torch.testing.assert_close(flex, gather, rtol=1e-5, atol=1e-5)
    model = LongNetDecoder(LongNetConfig(vocab_size=11, max_seq_len=64, embed_dim=16, num_heads=2,
                                         segment_lengths=(16, 32), dilation_rates=(1, 2)))
    with pytest.raises(ValueError, match="max_seq_len"):
        model(torch.zeros(1, 65, dtype=torch.long))
    assert not tracing()


def test_tracing_is_true_inside_a_compiled_function_and_adds_no_graph_break():
    seen = []

    def f(x):
        seen.append(tracing())
        return x * 2 if tracing() else x

    torch._dynamo.reset()
    assert torch.equal(torch.compile(f, fullgraph=True)(torch.ones(2)), torch.full((2,), 2.0))
    assert seen == [True] and f(torch.ones(2)).eq(1).all() and seen[-1] is False


@pytest.mark.parametrize("dynamic", [False, True])
def test_symbolic_tells_a_size_symbol_from_a_number_when_compiled_and_eager(dynamic):
    """Dynamo hides a SymInt from isinstance and type(): symbolic() is what tells a graph traced for any
    length (where a count that needs a number cannot be made) from one traced for this length."""
    seen = []

    def f(x):
        seen.append(symbolic(x.shape[0]))
        return x + 1

    torch._dynamo.reset()
    for n in (6, 7):  # under dynamic=False the second length recompiles for its own number
        torch.compile(f, fullgraph=True, dynamic=dynamic)(torch.ones(n))
    assert seen and set(seen) == {dynamic}, seen
    assert not symbolic(6) and not symbolic(7)
