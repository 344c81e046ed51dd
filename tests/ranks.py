"""Starting the ranks of a multi-process test as users start theirs: spawned
(torchrun and ``mp.spawn`` do the same), never forked. A fork after the parent
ran autograd on a machine with a GPU leaves the children an autograd engine
whose device threads did not survive the fork, and their first backward fails
("Unable to handle autograd's threading in combination with fork-based
multiprocessing"); pytest workers run backwards long before a ring test."""

from datetime import timedelta
from pathlib import Path

import torch.multiprocessing as mp

# How long a rank waits for the others (the rendezvous, each collective): far above the seconds a
# test's ranks take even on a busy machine, so only a rank that died or hung fails the wait.
TIMEOUT = timedelta(minutes=10)


def rendezvous(folder) -> str:
    """``init_method`` for ``init_process_group``: a file in the test's own folder. Not a TCP port:
    one found free could be taken before rank 0 listens on it (by a test in another pytest-xdist
    worker, or an outgoing connection)."""
    return (Path(folder) / "rendezvous").resolve().as_uri()


def start_ranks(worker, args: tuple, nprocs: int) -> None:
    """``worker(rank, *args)`` in ``nprocs`` spawned processes; returns when all have ended."""
    mp.start_processes(worker, args=args, nprocs=nprocs, join=True, start_method="spawn")
