"""Tearing a ``torch.distributed`` group down on every rank together, for the
multi-process tests and ``scripts/bench_ring.py``."""

from __future__ import annotations

from datetime import timedelta

import torch.distributed as dist


def leave_together(timeout: timedelta = timedelta(minutes=5)) -> None:
    """Destroy the default group once every rank is ready to. A gloo rank that
    destroys its group while a peer is still busy (rank 0 closing the store)
    can abort in C++ ("terminate called"). A gloo barrier is not enough: a rank
    can leave it before its last message has reached a peer still inside it,
    and tearing its context down then fails that peer (pytorch/gloo#155; a
    rank of ``bench_ring`` aborted so once in a full suite run after the
    barrier was added). So each rank also says it has left the barrier through
    the rendezvous store, which no rank's teardown closes, and destroys the
    group only once all have."""
    dist.barrier()
    store, rank, world = dist.distributed_c10d._get_default_store(), dist.get_rank(), dist.get_world_size()
    store.set(f"dilcompile/left/{rank}", "1")
    store.wait([f"dilcompile/left/{r}" for r in range(world)], timeout)
    dist.destroy_process_group()
