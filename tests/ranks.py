"""Starting the ranks of a multi-process test as users start theirs: spawned
(torchrun and ``mp.spawn`` do the same), never forked. A fork after the parent
ran autograd on a machine with a GPU leaves the children an autograd engine
whose device threads did not survive the fork, and their first backward fails
("Unable to handle autograd's threading in combination with fork-based
multiprocessing"); pytest workers run backwards long before a ring test."""

import socket

import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_ranks(worker, args: tuple, nprocs: int) -> None:
    """``worker(rank, *args)`` in ``nprocs`` spawned processes; returns when all have ended."""
    mp.start_processes(worker, args=args, nprocs=nprocs, join=True, start_method="spawn")
