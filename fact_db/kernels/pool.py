"""Worker processes, the parent's side: verify and time candidates in a child process, one per
GPU, with a time limit.

A candidate that hangs, faults (illegal address) or aborts takes down only its worker, never
the tuning run or the parent's CUDA context: the parent kills a worker that exceeds its time
limit, records the candidate as `timeout` or `crashed`, and starts a fresh worker for the next
one. The protocol and the child are fact_db/kernels/worker.py.

    >>> with WorkerPool(gpus=[0, 1], timeout=120) as pool:
    ...     results = pool.run(jobs)          # in the jobs' order
    >>> pool = shared_pool(None)              # one per process, kept between regions
"""
from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

@dataclass
class _Slot:
    gpu: str | None
    proc: subprocess.Popen | None = None
    lines: queue.Queue | None = None


class WorkerPool:
    """One worker process per GPU; `run(jobs)` spreads the jobs over them.

    `gpus` lists CUDA device indices (None: the current device only). Each job gets
    `timeout` seconds, its first job on a fresh worker `timeout + startup`.
    """

    def __init__(self, gpus: list[int] | None = None, timeout: float = 120.0, startup: float = 60.0,
                 command: list[str] | None = None):
        self.slots = [_Slot(str(g)) for g in gpus] if gpus else [_Slot(None)]
        self.command = command or [sys.executable, "-m", "fact_db.kernels.worker"]
        self.timeout = timeout
        self.startup = startup

    def _start(self, slot: _Slot) -> None:
        env = dict(os.environ)
        if slot.gpu is not None:
            env["CUDA_VISIBLE_DEVICES"] = slot.gpu
        env.setdefault("PYTHONUNBUFFERED", "1")
        slot.proc = subprocess.Popen(self.command, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
        slot.lines = queue.Queue()
        proc, lines = slot.proc, slot.lines

        def reader():
            for line in proc.stdout:
                lines.put(line)
            lines.put(None)
        threading.Thread(target=reader, daemon=True).start()

    def _kill(self, slot: _Slot) -> None:
        if slot.proc is not None:
            try:
                slot.proc.kill()
                slot.proc.wait(timeout=10)
            except (OSError, subprocess.SubprocessError):
                pass
        slot.proc = None

    def _run_one(self, slot: _Slot, job: dict) -> dict:
        fresh = slot.proc is None or slot.proc.poll() is not None
        if fresh:
            self._start(slot)
        limit = self.timeout + (self.startup if fresh else 0)
        t0 = time.perf_counter()
        try:
            slot.proc.stdin.write(json.dumps(job) + "\n")
            slot.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            self._kill(slot)
            return {"id": job["id"], "status": "crashed", "error": "worker exited before taking the job"}
        try:
            line = slot.lines.get(timeout=limit)
        except queue.Empty:
            self._kill(slot)
            return {"id": job["id"], "status": "timeout",
                    "error": f"no result within {limit:.0f} s (hung or too slow); worker killed"}
        if line is None:
            rc = slot.proc.wait()
            self._kill(slot)
            return {"id": job["id"], "status": "crashed", "error": f"worker died (exit code {rc})"}
        res = json.loads(line)
        res.setdefault("seconds", time.perf_counter() - t0)
        if res.get("status") == "crashed":
            self._kill(slot)
        return res

    def run(self, jobs: list[dict], progress=None) -> list[dict]:
        """Run every job; results in the jobs' order. `progress(result)` is called as each ends."""
        todo: queue.Queue = queue.Queue()
        for i, job in enumerate(jobs):
            todo.put((i, job))
        results: list[dict | None] = [None] * len(jobs)

        def drive(slot: _Slot):
            while True:
                try:
                    i, job = todo.get_nowait()
                except queue.Empty:
                    return
                results[i] = self._run_one(slot, job)
                if progress is not None:
                    progress(results[i])

        threads = [threading.Thread(target=drive, args=(s,)) for s in self.slots]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return [r for r in results if r is not None]

    def warm(self) -> None:
        """Start every worker now (import torch, create its CUDA context), in parallel, so the
        first job on each GPU does not pay for it."""
        jobs = [{"id": i, "kind": "ping"} for i in range(len(self.slots))]
        threads = [threading.Thread(target=self._run_one, args=(s, j)) for s, j in zip(self.slots, jobs)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def close(self) -> None:
        for slot in self.slots:
            if slot.proc is not None and slot.proc.poll() is None:
                try:
                    slot.proc.stdin.close()
                    slot.proc.wait(timeout=10)
                except (OSError, subprocess.SubprocessError):
                    self._kill(slot)
            slot.proc = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


_SHARED: dict = {}


def shared_pool(gpus: list[int] | None, timeout: float = 120.0) -> WorkerPool:
    """One pool per (GPUs, time limit) for the whole process, its workers kept between uses, so
    tuning a model's regions one after another starts each GPU's worker once, not per region.
    Closed at exit; a crashed or timed-out worker is replaced as usual."""
    import atexit
    key = (tuple(gpus) if gpus else None, timeout)
    if key not in _SHARED:
        if not _SHARED:
            atexit.register(close_shared)
        _SHARED[key] = WorkerPool(gpus, timeout=timeout)
    return _SHARED[key]


def close_shared() -> None:
    for pool in _SHARED.values():
        pool.close()
    _SHARED.clear()
