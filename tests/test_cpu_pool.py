"""The pool of single-threaded workers: order, thread count inside and after, and inline runs."""

from __future__ import annotations

import threading

import pytest
import torch

from microdreamer.cpu_pool import cpu_workers, map_single_threaded


def test_results_in_order_with_one_torch_thread_inside_and_threads_restored():
    before = torch.get_num_threads()
    seen = []

    def work(i: int) -> int:
        seen.append((torch.get_num_threads(), threading.get_ident()))
        return i * i

    assert map_single_threaded(work, list(range(7)), 3) == [i * i for i in range(7)]
    assert all(n == 1 for n, _ in seen)
    assert torch.get_num_threads() == before


def test_one_worker_runs_inline_and_errors_propagate_with_threads_restored():
    before = torch.get_num_threads()
    main = threading.get_ident()
    assert map_single_threaded(lambda _: threading.get_ident(), [0, 1], 1) == [main, main]

    def fail(i: int) -> int:
        raise ValueError(f"part {i}")

    with pytest.raises(ValueError, match="part"):
        map_single_threaded(fail, [0, 1], 2)
    assert torch.get_num_threads() == before


def test_workers_follow_device_parts_and_threads():
    assert cpu_workers(torch.device("cuda"), 10) == 1
    assert cpu_workers(torch.device("cpu"), 0) == 1
    assert cpu_workers(torch.device("cpu"), 1) == 1
    assert cpu_workers(torch.device("cpu"), 100) == torch.get_num_threads()
