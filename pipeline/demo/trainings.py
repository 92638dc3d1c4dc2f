"""Training runs of the demo's experiments: run side by side in worker processes
(`Trainings`), each resumed from its last checkpoint and marked done, with numbered progress
lines (`Steps`)."""

from __future__ import annotations

import os
import signal
import time
from contextlib import contextmanager
from pathlib import Path


class Steps:
    """Numbered progress lines with the time since the demo started."""

    def __init__(self, total: int) -> None:
        self.total, self.done, self.start = total, 0, time.perf_counter()

    def __call__(self, what: str) -> None:
        self.done += 1
        elapsed = time.perf_counter() - self.start
        print(f"\n[{self.done}/{self.total}] {what}  ({elapsed:.0f} s so far)", flush=True)


def train_run(build, config, run: Path) -> None:
    """A pretraining or fine-tuning run (`build`: pretrain_job or finetune_job) in this process,
    resumed from its last checkpoint if an earlier one broke off; its `done` file marks it
    finished (Trainings skips it then)."""
    from pipeline.train.checkpoint import latest_checkpoint
    from pipeline.train.launch import run_training

    resume = latest_checkpoint(run) is not None
    run_training(build, config, run, resume=resume)
    (run / "done").write_text("")


def _train_logged(build, config, run: Path) -> float:
    """`train_run` in a worker process with its output in run/train.log; returns its seconds."""
    import contextlib

    run.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with open(run / "train.log", "a") as log, contextlib.redirect_stdout(log), \
            contextlib.redirect_stderr(log):
        train_run(build, config, run)
    return time.perf_counter() - start


def _start_worker(parent: int) -> None:
    """A worker's start: exit within a second once the demo's process `parent` has gone (killed:
    `kill`, a scheduler's time limit), instead of training on into run directories that the next
    demo resumes. (Interrupted, the demo ends its workers itself: `Trainings.__exit__`.)
    Its progress bars write to its own logs and lock with a thread lock: tqdm's default, a
    semaphore of the whole machine, is left behind by an ended worker, for a warning at exit."""
    import threading

    from tqdm import tqdm

    tqdm.set_lock(threading.RLock())

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1)
        os._exit(1)

    threading.Thread(target=watch, name="exit-with-demo", daemon=True).start()


@contextmanager
def _ctrl_c_ignored():
    """Ctrl-C ignored inside (and by the processes started there, which inherit it)."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _last_step(run: Path) -> int:
    from pipeline.train.logs import METRICS, read_metrics

    records = read_metrics(run) if (run / METRICS).is_file() else []
    return records[-1]["step"] if records else 0


class Trainings:
    """Training runs, `parallel` at once in worker processes (each run's output in its
    train.log), with a progress line every half minute; with parallel <= 1 each run trains in
    this process when it is submitted. A finished run (its `done` file) is not trained again.
    The workers exit when this process is killed."""

    def __init__(self, parallel: int) -> None:
        self.pool, self.futures = None, {}
        if parallel > 1:
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor

            context = multiprocessing.get_context("spawn")  # no forked torch threads or Ray state
            self.pool = ProcessPoolExecutor(parallel, mp_context=context, initializer=_start_worker,
                                            initargs=(os.getpid(),))

    def __enter__(self) -> Trainings:
        return self

    def __exit__(self, kind, *_) -> None:
        if self.pool is None:
            return
        if kind is None:
            self.pool.shutdown(cancel_futures=True)
            return
        # Interrupted or failed: the runs in progress are ended, not waited for, and a second
        # Ctrl-C cannot cut this short (the workers, which ignore it, would then train on).
        with _ctrl_c_ignored():
            for worker in self.pool._processes.values():
                worker.terminate()
            self.pool.shutdown(cancel_futures=True)

    def submit(self, name: str, build, config, run: Path) -> None:
        if (run / "done").is_file():
            print(f"{name}: {run}: trained already")
        elif self.pool is None:
            print(f"\n{name}:")
            train_run(build, config, run)
        else:
            print(f"{name}: queued (output: {run / 'train.log'})", flush=True)
            with _ctrl_c_ignored():  # the workers it starts ignore the terminal's Ctrl-C
                future = self.pool.submit(_train_logged, build, config, run)
            self.futures[future] = (name, run)

    def wait(self, name: str | None = None) -> None:
        """Until run `name` (None: every run) has finished."""
        from concurrent.futures import FIRST_COMPLETED, wait

        def waiting() -> bool:
            names = [n for n, _ in self.futures.values()]
            return name in names if name else bool(names)

        while waiting():
            finished, _ = wait(list(self.futures), timeout=30, return_when=FIRST_COMPLETED)
            for future in finished:
                done, run = self.futures.pop(future)
                if future.exception() is not None:
                    print(f"{done}: failed; its output is in {run / 'train.log'}")
                    raise future.exception()
                print(f"{done}: trained in {future.result():.0f} s", flush=True)
            at = {n: _last_step(run) for n, run in self.futures.values()}
            steps = [f"{n} at step {step}" for n, step in at.items() if step]
            if steps and not finished:
                print("  " + ", ".join(steps), flush=True)
