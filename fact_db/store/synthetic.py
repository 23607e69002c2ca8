"""Synthetic registry rows for benchmarks and tests: plausible, verified GEMM kernels.

    >>> reg.bulk_insert_rows(synthetic_rows(100_000, seed=1))      # storage form, seconds
    >>> recs = list(synthetic_records(50))                          # checked KernelRecords

Every row is measured in SYNTHETIC_ENV (with its GPU's name as the SKU) and template hash
"synthetic"; SYNTHETIC_ENV itself names no GPU, so judged under it only CUTLASS and nvcc are
compared: pass `env=SYNTHETIC_ENV, template_hashes={"gemm_sm90":
"synthetic", "gemm_sm80": "synthetic"}` to judge them all current.
"""
from __future__ import annotations

import json
import random
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone

from fact_db.core.environment import Environment
from fact_db.store.keys import GemmKey
from fact_db.store.records import KernelRecord
from fact_db.store.tables import env_columns, kernel_record, key_columns

SYNTHETIC_ENV = Environment(cutlass="4.2.0.0", nvcc="13.0.88")
RULES = ("gemm", "gemm-bias", "gemm-bias-relu", "gemm-bias-gelu-tanh", "gemm-residual", "batched-gemm")
_EPILOGUE = {"gemm": "none", "gemm-bias": "bias", "gemm-bias-relu": "bias_relu", "gemm-bias-gelu-tanh": "bias_gelu_tanh",
             "gemm-residual": "residual", "batched-gemm": "none"}
_POLICY_DTYPE = {"fp32": "float32", "tf32": "float32", "tf32x3": "float32", "bf16": "bfloat16", "fp16": "float16"}


def synthetic_rows(n: int, *, seed: int = 0, gpus=("h100", "h200", "a100"), rules=None) -> Iterator[dict]:
    """`n` distinct verified GEMM rows in storage form (the kernels table's columns), for
    Registry.bulk_insert_rows; deterministic per seed.

    Keys spread over rules, GPUs, policies, epilogues, layouts and multiple-of-64 shapes (plus
    a few off by 8 or 16), so a nearest-shape search has dozens of compatible candidates to rank.
    """
    rnd = random.Random(seed)
    rules = rules or RULES
    sizes = [64 * i for i in range(1, 129)] + [s - 8 for s in (1024, 2048, 4096)] + [s + 16 for s in (1024, 2048)]
    seen: set[str] = set()
    made = 0
    created = datetime(2026, 1, 1, tzinfo=timezone.utc)
    while made < n:
        rule = rnd.choice(rules)
        policy = rnd.choice(tuple(_POLICY_DTYPE))
        dt = _POLICY_DTYPE[policy]
        gpu = rnd.choice(gpus)
        key = GemmKey(rule=rule, arch="sm80" if gpu == "a100" else "sm90a", gpu=gpu, dtype_in=dt, dtype_acc="float32",
                      dtype_out=dt, layout_a="row", layout_b=rnd.choice(("row", "col")), m=rnd.choice(sizes),
                      n=rnd.choice(sizes), k=rnd.choice(sizes),
                      batch=rnd.choice((2, 4, 8, 16)) if rule == "batched-gemm" else 1, epilogue=_EPILOGUE[rule],
                      policy=policy)
        cols = key_columns(key)
        if cols["digest"] in seen:
            continue
        seen.add(cols["digest"])
        made += 1
        t = round(2 * key.m * key.n * key.k * key.batch / 4e11 * 1e3 * rnd.uniform(0.8, 1.5), 6)
        config = {"tile_m": rnd.choice((64, 128, 256)), "tile_n": rnd.choice((64, 128, 256)),
                  "tile_k": rnd.choice((32, 64)), "stages": rnd.choice((3, 4, 5))}
        when = (created + timedelta(seconds=made)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        yield {**cols, "template": "gemm_sm80" if gpu == "a100" else "gemm_sm90", "label": "",
               "config": json.dumps(config, sort_keys=True, separators=(",", ":")), "source_hash": f"{made:016x}",
               "template_hash": "synthetic", "source": "",
               **env_columns(SYNTHETIC_ENV.with_(gpu_sku=f"NVIDIA {gpu.upper()}")), "factdb_version": "0.1.0",
               "time_ms": t, "baseline": "torch eager", "baseline_ms": round(t * rnd.uniform(1.0, 1.6), 6),
               "rel_err": 1e-6, "baseline_rel_err": 1e-6, "provenance": "rule", "status": "verified",
               "stale_reason": "", "error": "", "notes": "synthetic", "created_at": when, "updated_at": when}


def synthetic_records(n: int, *, seed: int = 0, **kw) -> Iterator[KernelRecord]:
    """synthetic_rows as checked KernelRecords (slower; for tests)."""
    return (kernel_record(r) for r in synthetic_rows(n, seed=seed, **kw))
