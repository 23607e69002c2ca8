"""Worker: the child process that verifies and times candidates, one per GPU, started by
fact_db.kernels.pool.WorkerPool. A worker that sees a CUDA error it cannot recover from
reports it and exits, so no later candidate runs in a poisoned context.

Protocol: the parent writes one JSON job per line to the worker's stdin and reads one JSON
result per line from its stdout (everything else the worker prints goes to stderr). A job's
`kind` names the family that runs it (fact_db.kernels.families.for_job): `cutlass` and `eager`
(GEMM), `attention`, `norm`, `region_compile` and `region_run` (the agent's kernels: nvcc runs
here, never in the parent); `ping` only starts the worker.

    job    {"id", "kind", ...the family's fields}
    result {"id", "status": ok|verify_failed|launch_error|crashed|timeout|..., "time_ms",
            "p10_ms", "p90_ms", "err", "eager_err", "error", "device"}

    python -m fact_db.kernels.worker        # started by WorkerPool, not by hand
"""
from __future__ import annotations

import json
import os
import sys

from fact_db.kernels import families


def _run_job(job: dict, cache: dict) -> dict:
    if job["kind"] == "ping":  # start-up only: torch imported, CUDA context made
        import torch
        torch.cuda.init()
        return {"id": job["id"], "status": "ok", "gpu": os.environ.get("CUDA_VISIBLE_DEVICES", "")}
    return families.for_job(job["kind"]).run_job(job, cache)


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


if __name__ == "__main__":
    sys.exit(main())
