"""A stored kernel row's columns as a KernelRecord, and the schema version rows are written at:
shared by the SQLAlchemy tables (fact_db.store.tables) and the lean reader (fact_db.store.reader),
in a module that imports no database library.

    >>> kernel_record({"family": "gemm", "key": "...", "config": "{}", ...}) == rec
"""
from __future__ import annotations

import json

from fact_db.core.environment import Environment
from fact_db.store.keys import Key
from fact_db.store.records import KernelRecord

SCHEMA_VERSION = 7  # the newest schema this fact-db writes; see fact_db.store.migrations.MIGRATIONS

# Environment field -> column (`torch` alone would read as the library in SQL and in code)
ENV_COLUMNS = {"gpu_sku": "gpu_sku", "driver": "driver_version", "cuda": "cuda_version", "torch": "torch_version",
               "cublas": "cublas_version", "cudnn": "cudnn_version", "cutlass": "cutlass_version",
               "nvcc": "nvcc_version"}
# a kernel record's fields stored in columns of their own name, in the record's order
KERNEL_OWN = ("template", "label", "time_ms", "baseline", "baseline_ms", "rel_err", "baseline_rel_err", "status",
              "provenance", "source_hash", "template_hash", "source", "factdb_version", "error", "stale_reason",
              "notes", "created_at", "updated_at")


def env_of(m) -> Environment:
    """The Environment of a row's columns (a mapping or a Row)."""
    m = getattr(m, "_mapping", m)
    return Environment(**{f: m[col] for f, col in ENV_COLUMNS.items()})


def key_of(m) -> Key:
    m = getattr(m, "_mapping", m)
    return Key.from_dict(m["family"], json.loads(m["key"]))


def kernel_record(row) -> KernelRecord:
    """The KernelRecord of a `kernels` row (a SQLAlchemy Row, or any mapping of its columns)."""
    m = getattr(row, "_mapping", row)
    return KernelRecord(key=key_of(m), env=env_of(m), config=json.loads(m["config"]), **{f: m[f] for f in KERNEL_OWN})
