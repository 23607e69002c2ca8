"""The registry's tables as SQLModel models, and records to rows and back.

    >>> kernel_row(rec)["near"] == rec.key.near()
    True
    >>> kernel_record(conn.execute(sa.select(K)).first()) == rec
    True

These models have their own metadata: the index's SQLModel.metadata.create_all never creates
them; fact_db.store.migrations does (with frozen copies of these definitions), and
tests/test_registry.py checks that the migrated columns match the models.

One `kernels` table holds every family: `key` is the key's canonical JSON, `near`, `div` and
`dims` serve the nearest lookup (fact_db.store.nearest), `rule`, `arch`, `gpu`, `policy` and
`dtype` the filters, and eight columns the environment key (ENV_COLUMNS). A kernel row read
back as a record (kernel_record) is fact_db.store.rows', which the lean reader shares.
"""
from __future__ import annotations

import json
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.orm import registry as _sa_registry
from sqlmodel import Field, SQLModel

from fact_db.core.environment import Environment
from fact_db.store.keys import Key, canonical_json
from fact_db.store.records import KernelRecord, TrialRecord
from fact_db.store.rows import ENV_COLUMNS, KERNEL_OWN as _KERNEL_OWN, env_of, kernel_record, key_of  # noqa: F401


class _Base(SQLModel, registry=_sa_registry()):
    pass


class KernelRow(_Base, table=True):
    __tablename__ = "kernels"
    digest: str = Field(primary_key=True)
    family: str
    key: str = Field(sa_type=sa.Text)
    near: str
    div: str
    rule: str
    arch: str
    gpu: str
    policy: str
    dtype: str
    dims: str = Field(sa_type=sa.Text)
    template: str
    label: str
    config: str = Field(sa_type=sa.Text)
    source_hash: str
    template_hash: str
    source: str = Field(sa_type=sa.Text)
    gpu_sku: str
    driver_version: str
    cuda_version: str
    torch_version: str
    cublas_version: str
    cudnn_version: str
    cutlass_version: str
    nvcc_version: str
    factdb_version: str
    time_ms: float | None = Field(default=None, sa_type=sa.Double)
    baseline: str
    baseline_ms: float | None = Field(default=None, sa_type=sa.Double)
    rel_err: float | None = Field(default=None, sa_type=sa.Double)
    baseline_rel_err: float | None = Field(default=None, sa_type=sa.Double)
    provenance: str
    status: str
    stale_reason: str = Field(sa_type=sa.Text)
    error: str = Field(sa_type=sa.Text)
    notes: str = Field(sa_type=sa.Text)
    created_at: str
    updated_at: str


class TrialRow(_Base, table=True):
    __tablename__ = "trials"
    id: str = Field(primary_key=True)
    digest: str
    family: str
    key: str = Field(sa_type=sa.Text)
    template: str
    config: str = Field(sa_type=sa.Text)
    config_hash: str
    status: str
    time_ms: float | None = Field(default=None, sa_type=sa.Double)
    rel_err: float | None = Field(default=None, sa_type=sa.Double)
    error: str = Field(sa_type=sa.Text)
    template_hash: str
    gpu_sku: str
    driver_version: str
    cuda_version: str
    torch_version: str
    cublas_version: str
    cudnn_version: str
    cutlass_version: str
    nvcc_version: str
    factdb_version: str
    created_at: str


class RuleRow(_Base, table=True):
    __tablename__ = "rules"
    id: str = Field(primary_key=True)
    family: str
    title: str = Field(sa_type=sa.Text)
    path: str = Field(sa_type=sa.Text)
    hash: str
    template: str
    status: str
    updated_at: str


class ExampleRow(_Base, table=True):
    __tablename__ = "examples"
    id: str = Field(primary_key=True)
    kind: str
    title: str = Field(sa_type=sa.Text)
    source_path: str = Field(sa_type=sa.Text)
    hash: str
    arch: str
    notes: str = Field(sa_type=sa.Text)
    updated_at: str


class LeaseRow(_Base, table=True):
    """A workload being tuned: claimed by `holder` (host:pid:nonce) until `expires_at` (server time)."""
    __tablename__ = "leases"
    digest: str = Field(primary_key=True)
    family: str
    key: str = Field(sa_type=sa.Text)
    holder: str
    host: str
    pid: int
    taken_at: datetime = Field(sa_type=sa.DateTime(timezone=True))
    expires_at: datetime = Field(sa_type=sa.DateTime(timezone=True))


class OutboxRow(_Base, table=True):
    """A kernel row (kind `kernel`, id its digest) or trial (`trial`, its id) that the team
    registry's cache holds and its server does not yet."""
    __tablename__ = "outbox"
    kind: str = Field(primary_key=True)
    id: str = Field(primary_key=True)
    queued_at: str


class BinaryRow(_Base, table=True):
    """A built kernel a team registry shares by its build key (fact_db.kernels.build.content_key:
    the source, nvcc's flags and version, CUTLASS's), so a host that takes another host's winner
    loads it instead of compiling it again. Only where the hosts opt in (FACTDB_SHARE_BINARIES):
    every host then runs code any host that may write the registry stored."""
    __tablename__ = "kernel_binaries"
    build_key: str = Field(primary_key=True)
    sha256: str
    size: int
    arch: str
    host: str
    created_at: str
    data: bytes = Field(sa_type=sa.LargeBinary)


class MetaRow(_Base, table=True):
    __tablename__ = "factdb_meta"
    key: str = Field(primary_key=True)
    value: str = Field(sa_type=sa.Text)


METADATA = _Base.metadata
K = KernelRow.__table__
TR = TrialRow.__table__
LEASES = LeaseRow.__table__
OUTBOX = OutboxRow.__table__
BINARIES = BinaryRow.__table__
_TRIAL_OWN = ("template", "status", "time_ms", "rel_err", "error", "config_hash", "template_hash", "factdb_version",
              "created_at", "id")


def env_columns(env: Environment) -> dict:
    return {col: getattr(env, f) for f, col in ENV_COLUMNS.items()}


def key_columns(key: Key) -> dict:
    return {"digest": key.digest(), "family": key.FAMILY, "key": canonical_json(key.as_dict()), "near": key.near(),
            "div": key.div, "rule": key.rule_name, "arch": key.arch, "gpu": key.gpu, "policy": key.policy,
            "dtype": key.dtype_name, "dims": canonical_json(key.dims())}


def kernel_row(rec: KernelRecord) -> dict:
    d = key_columns(rec.key)
    d.update({f: getattr(rec, f) for f in _KERNEL_OWN})
    d.update(env_columns(rec.env))
    d["config"] = canonical_json(rec.config)
    return d


def export_dict(row) -> dict:
    """KernelRecord.as_dict() of a stored row, without rebuilding (and re-checking) the record."""
    m = getattr(row, "_mapping", row)
    key = json.loads(m["key"])
    d = {"digest": m["digest"], "family": m["family"], **{f: key[f] for f in Key.family_class(m["family"]).FIELDS},
         "template": m["template"], "config": json.loads(m["config"])}
    d.update({f: m[f] for f in _KERNEL_OWN[1:12]})        # label .. source, in the record's field order
    d.update({f: m[col] for f, col in ENV_COLUMNS.items()})
    d.update({f: m[f] for f in _KERNEL_OWN[12:]})
    return d


def trial_row(rec: TrialRecord) -> dict:
    d = {k: v for k, v in key_columns(rec.key).items() if k in ("digest", "family", "key")}
    d.update({f: getattr(rec, f) for f in _TRIAL_OWN})
    d.update(env_columns(rec.env))
    d["config"] = canonical_json(rec.config)
    return d


def trial_record(row) -> TrialRecord:
    m = getattr(row, "_mapping", row)
    return TrialRecord(key=key_of(m), env=env_of(m), config=json.loads(m["config"]), **{f: m[f] for f in _TRIAL_OWN})
