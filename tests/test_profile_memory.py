"""dilcompile/profile/memory.py: the peak and the bytes allocated, replayed from the profiler's
allocation events (CPU has no allocator statistics), on a known allocation pattern."""

import torch

from dilcompile.profile.memory import Allocations, peak_bytes, replay, trace

MB = 2**20


def test_replay_keeps_the_running_sums_peak_and_adds_up_allocations():
    assert replay([4 * MB, -4 * MB, 8 * MB]) == Allocations(peak_bytes=8 * MB, allocated_bytes=12 * MB)
    assert replay([4 * MB, 8 * MB, -4 * MB]) == Allocations(peak_bytes=12 * MB, allocated_bytes=12 * MB)
    assert replay([]) == Allocations(0, 0)


def _pattern():
    a = torch.empty(4 * MB, dtype=torch.uint8)
    del a  # freed before the 8 MB: the peak is 8 MB, not 12
    return torch.empty(8 * MB, dtype=torch.uint8)


def test_cpu_peak_of_alloc_4mb_free_alloc_8mb_is_8mb():
    peak = peak_bytes(_pattern, "cpu")
    assert 8 * MB <= peak < 8 * MB + 64 * 1024, peak  # the 8 MB, plus what the profiler itself allocates


def test_regions_count_only_the_allocations_inside_each_compiled_call():
    double = torch.compile(lambda x: x * 2, fullgraph=True)
    x = torch.ones(MB // 4)  # 1 MB of float32
    double(x)  # compiled before it is traced

    def calls():
        torch.empty(16 * MB, dtype=torch.uint8)  # outside the compiled calls: not theirs
        double(x)
        double(x)

    t = trace(calls, "cpu")
    assert t.total().allocated_bytes >= 18 * MB
    regions = t.regions("Torch-Compiled Region")
    assert len(regions) == 2
    assert all(MB <= r.allocated_bytes < 2 * MB for r in regions), regions
