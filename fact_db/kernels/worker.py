"""Worker: verify and time candidates in a child process, one per GPU, with a time limit.

A candidate that hangs, faults (illegal address) or aborts takes down only its worker,
never the tuning run or the parent's CUDA context: the parent kills a worker that
exceeds its time limit, records the candidate as `timeout` or `crashed`, and starts a
fresh worker for the next one. A worker that sees a CUDA error it cannot recover from
reports it and exits, so no later candidate runs in a poisoned context.

Protocol: the parent writes one JSON job per line to the worker's stdin and reads one
JSON result per line from its stdout (everything else the worker prints goes to stderr).

    job    {"id", "kind": "cutlass"|"eager"|"norm", "so", "template", "spec", "options",
            "workload", "trials", "reps"}
           region kernels (fact_db/kernels/region/region_kernel.py): {"id", "kind": "region_compile", "source",
           "name", "arch", "timeout"} (nvcc runs here, never in the parent) and
           {"id", "kind": "region_run", "so", "region", "trials", "reps"}
    result {"id", "status": ok|verify_failed|launch_error|crashed|timeout, "time_ms",
            "p10_ms", "p90_ms", "err", "eager_err", "error", "device"}

    python -m fact_db.kernels.worker        # started by WorkerPool, not by hand
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

_INPUT_SETS = 3


def _run_job(job: dict, cache: dict) -> dict:
    if job["kind"] == "region_compile":  # a proposed kernel source: compiled only in this process
        from fact_db.kernels.region.region_kernel import compile_job
        return compile_job(job)
    if job["kind"] == "region_run":  # verify against float64 and time against eager (or "needs_gpu")
        from fact_db.kernels.region.region_kernel import run_job as region_run
        return region_run(job)
    import torch
    if job["kind"] == "ping":  # start-up only: torch imported, CUDA context made
        torch.cuda.init()
        return {"id": job["id"], "status": "ok", "gpu": os.environ.get("CUDA_VISIBLE_DEVICES", "")}
    if job["kind"] == "attention":  # fact_db/kernels/attention/tune.py: a library backend or an attention kernel
        from fact_db.kernels.attention.tune import run_job
        return run_job(job, cache)

    if job["kind"] == "norm":  # a norm candidate (so set) or eager (so empty): fact_db/kernels/norm/norm.py
        from fact_db.kernels.norm.norm import NormWorkload, evaluate_one
        res = evaluate_one(NormWorkload(**job["workload"]), job.get("so") or None, job.get("trials", 4),
                           job.get("reps", 30))
        return {"id": job["id"], "gpu": os.environ.get("CUDA_VISIBLE_DEVICES", ""), **res}

    from fact_db.kernels.bench import time_cuda
    from fact_db.kernels.gemm.kernel import GemmKernel, GemmSpec
    from fact_db.kernels.verify import verify
    from fact_db.kernels.gemm.workload import GemmWorkload

    w = GemmWorkload(**job["workload"])
    if job["kind"] == "eager":
        def run(inputs, out=None):
            y = w.eager(inputs)
            if out is not None:
                out.copy_(y)
            return y
    else:
        k = GemmKernel(job["so"], job["template"], GemmSpec(**job["spec"]),
                       tuple(job["options"]) if job.get("options") else None)

        def run(inputs, out=None):
            return k(inputs["a"], inputs["b"], bias=inputs.get("bias"), c=inputs.get("c"),
                     alpha=1.0, beta=1.0 if "c" in inputs else 0.0, out=out)
    verdict = verify(run, w, trials=job.get("trials", 5))
    res = {"id": job["id"], "err": verdict.err, "eager_err": verdict.eager_err,
           "device": torch.cuda.get_device_name(), "gpu": os.environ.get("CUDA_VISIBLE_DEVICES", ""),
           "uuid": str(getattr(torch.cuda.get_device_properties(0), "uuid", ""))}
    if not verdict.ok:
        status = "launch_error" if verdict.reason.startswith("launch failed") else "verify_failed"
        return {**res, "status": status, "error": verdict.reason}
    wk = json.dumps(job["workload"], sort_keys=True)
    if cache.get("key") != wk:
        cache.clear()
        torch.cuda.empty_cache()
        cache["key"] = wk
        cache["sets"] = [w.make_inputs("randn") for _ in range(_INPUT_SETS)]
    t = time_cuda(run, cache["sets"], reps=job.get("reps", 20))
    return {**res, "status": "ok", "time_ms": t.median_ms, "p10_ms": t.p10_ms, "p90_ms": t.p90_ms,
            "error": ""}


def main() -> int:
    import torch
    out = sys.stdout
    sys.stdout = sys.stderr  # anything else printed goes to stderr, not into the protocol
    cache: dict = {}
    for line in sys.stdin:
        if not line.strip():
            continue
        job = json.loads(line)
        try:
            res = _run_job(job, cache)
        except Exception as e:  # noqa: BLE001
            res = {"id": job.get("id"), "status": "launch_error", "error": f"{type(e).__name__}: {e}"}
        fatal = False
        try:
            if torch.cuda.is_initialized():  # a job that never touched CUDA (a compile) has nothing to wait for
                torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001  (sticky error: the context is gone)
            res = {"id": job.get("id"), "status": "crashed", "error": f"CUDA context lost: {e}"}
            fatal = True
        out.write(json.dumps(res) + "\n")
        out.flush()
        if fatal:
            return 3
    return 0


# ------------------------------------------------------------------------------------------
# Parent side.

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


if __name__ == "__main__":
    sys.exit(main())
