"""The worker every face hands its llama.cpp calls to: one thread, in order, results and errors carried back."""

from __future__ import annotations

import threading

import pytest

from localspec.worker import Worker


def test_everything_runs_on_one_thread_in_the_order_it_was_given() -> None:
    worker = Worker("test-worker")
    seen: list[tuple[int, int]] = []
    futures = [worker.submit(lambda i=i: seen.append((i, threading.get_ident()))) for i in range(20)]
    for f in futures:
        f.result(timeout=10)
    assert [i for i, _ in seen] == list(range(20))
    assert len({ident for _, ident in seen}) == 1 and seen[0][1] != threading.get_ident()
    assert worker.call(lambda: threading.current_thread().name).startswith("test-worker")
    worker.shutdown(wait=True)


def test_a_failure_comes_back_to_the_caller_and_the_worker_goes_on() -> None:
    worker = Worker()

    def boom() -> None:
        raise ValueError("no model")

    with pytest.raises(ValueError, match="no model"):
        worker.call(boom)
    assert worker.call(lambda: 41 + 1) == 42
    worker.shutdown(wait=True)


def test_shutting_down_raises_the_stop_flag_the_running_work_checks() -> None:
    worker = Worker()
    started = threading.Event()

    def loop() -> int:
        started.set()
        passes = 0
        while not worker.stop_requested.is_set():
            passes += 1
            worker.stop_requested.wait(0.01)
        return passes

    future = worker.submit(loop)
    assert started.wait(10)
    worker.shutdown(wait=False)
    assert future.result(timeout=10) >= 1
