"""Host cost of calling a kernel through each way PyTorch offers to register one, on the
GPU machine: a tiny ATen op, a `torch.library.custom_op` (what fact_db/kernels/ops.py registers), a
plain `torch.library.Library` implementation, and the Python function itself. Each op
returns a preallocated CUDA tensor (no launch), so the figure is dispatch alone.

    python benchmarks/op_dispatch.py [--json PATH]
"""
from __future__ import annotations

import argparse
import json
import time

import torch

SCHEMA = "(Tensor a, Tensor b, Tensor? bias, Tensor? c, float alpha, float beta) -> Tensor"


def _us(fn, n: int = 20000) -> float:
    for _ in range(1000):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    dt = time.perf_counter() - t0
    torch.cuda.synchronize()
    return dt / n * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    out = torch.empty(4, 4, device="cuda")
    x = torch.ones(4, 4, device="cuda")

    def impl(a, b, bias, c, alpha, beta):
        return out

    torch.library.custom_op("dispatch_bench::custom", impl, mutates_args=(), device_types="cuda", schema=SCHEMA)
    lib = torch.library.Library("dispatch_bench2", "DEF")
    lib.define("plain" + SCHEMA[SCHEMA.index("("):])
    lib.impl("plain", impl, "CUDA")
    custom, plain = torch.ops.dispatch_bench.custom, torch.ops.dispatch_bench2.plain
    with torch.no_grad():
        res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
               "python_call_us": _us(lambda: impl(x, x, None, None, 1.0, 0.0)),
               "aten_add_us": _us(lambda: torch.add(x, x)),
               "custom_op_us": _us(lambda: custom(x, x, None, None, 1.0, 0.0)),
               "library_impl_us": _us(lambda: plain(x, x, None, None, 1.0, 0.0))}
    print(json.dumps(res, indent=1))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
