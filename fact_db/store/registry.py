"""The kernel registry: every tuned kernel (winner) and every candidate tried, by key.

    >>> reg = Registry.open()                     # $FACTDB_DB, else $FACTDB_HOME/fact.duckdb
    >>> key = KernelKey(rule="gemm", arch="sm90a", gpu="h100", dtype_in="float32",
    ...                 dtype_acc="float32", dtype_out="float32", layout_a="row", layout_b="col",
    ...                 m=4096, n=4096, k=4096, batch=1, epilogue="none", policy="tf32")
    >>> reg.put_kernel(KernelRecord(key=key, template="gemm_sm90", config={"tile_m": 128},
    ...                             time_ms=1.9, baseline="torch eager", baseline_ms=2.4).stamped())
    'inserted'
    >>> hit = reg.lookup(key.with_(m=3968))       # exact, else the nearest compatible shape
    >>> hit.exact, round(hit.distance, 3), hit.stale
    (False, 0.046, False)

Lookup. The exact key first. Otherwise the nearest shape among rows with the same rule,
arch, GPU, dtypes, layouts, epilogue and policy whose M, N and K each fall in the same
divisibility class (the largest of 128, 64, 16, 8, 1 that divides it: a tile config tuned
on a shape divisible by 128 may rely on it). Distance is
|log2(M/M')| + |log2(N/N')| + |log2(K/K')| + |log2(B/B')| (0.0 means exact; doubling one
dimension costs 1.0). The nearest usable row wins; a stale one is returned only when no
usable row is compatible, flagged. Failed rows are never returned.

Staleness. A row is stale when its CUTLASS or nvcc version, or the hash of its template
file, differs from the toolchain's now (fact-db's own version does not count), or when
`revalidate` has marked it so. Lookup returns a stale row with `.stale` and the reason,
never as a usable hit.

Merge (put_kernel, import_jsonl), per key. Rows rank: verified under the current
toolchain > verified or stale under another toolchain > failed. A higher rank replaces a
lower one; a verified row is never replaced by an unverified one. Within a rank: two
rows built with the same toolchain -> the faster wins (a tie keeps the old row); with
different toolchains -> the newer `created_at` wins.
"""
from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import math
import os
import re
import sys
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import IO

import sqlalchemy as sa
from sqlalchemy.orm import registry as _sa_registry
from sqlmodel import Field, SQLModel

from fact_db.core import paths
from fact_db.store.db import (  # noqa: F401  (re-exported: callers catch these from here)
    Database,
    NotARegistry,
    RegistryBusy,
    RegistryError,
    connect_duckdb,
    resolve_url,
    write_meta,
)

KERNEL_STATUSES = ("verified", "stale", "failed")
TRIAL_STATUSES = ("ok", "compile_error", "verify_failed", "launch_error", "timeout", "crashed", "skipped")
TRIAL_FAILURES = frozenset(TRIAL_STATUSES) - {"ok", "skipped"}
PROVENANCES = ("rule", "llm", "seed", "import")
POLICIES = ("fp32", "tf32x3", "tf32", "bf16", "fp16")
DTYPES = ("float32", "float16", "bfloat16", "float64", "float8_e4m3fn", "float8_e5m2", "int8", "int32")
_DTYPE_ALIASES = {"fp32": "float32", "float": "float32", "f32": "float32", "fp16": "float16", "half": "float16",
                  "f16": "float16", "bf16": "bfloat16", "fp64": "float64", "double": "float64"}
DIV_CLASSES = (128, 64, 16, 8)
_SLUG = re.compile(r"[a-z0-9][a-z0-9_.-]*")
_ARCH = re.compile(r"sm_?\d{2,3}[a-z]?")


# --------------------------------------------------------------------------------------
# keys

_GPU_MODELS = re.compile(r"(?<![a-z0-9])(gb300|gb200|gh200|b300|b200|b100|h200|h100|h800|h20|a100|a800|a10g|a10|a16|"
                         r"a30|a40|a2|l40s|l40|l4|v100|p100|t4)(?![a-z0-9])")


def canonical_gpu(name: str) -> str:
    """The short GPU name used in keys, from torch.cuda.get_device_name() or a short name.

    >>> canonical_gpu("NVIDIA H100 80GB HBM3"), canonical_gpu("NVIDIA A100-SXM4-80GB")
    ('h100', 'a100')
    >>> canonical_gpu("NVIDIA GeForce RTX 4090")
    'geforce-rtx-4090'
    """
    low = (name or "").strip().lower()
    m = _GPU_MODELS.search(low)
    if m:
        return m.group(1)
    slug = re.sub(r"[^a-z0-9]+", "-", re.sub(r"^nvidia\b", "", low)).strip("-")
    if not slug:
        raise RegistryError(f"GPU name {name!r} is empty; pass torch.cuda.get_device_name() or a short name such as h100")
    return slug


def _div_class(x: int) -> int:
    return next((d for d in DIV_CLASSES if x % d == 0), 1)


@dataclass(frozen=True)
class KernelKey:
    """What a tuned kernel is for. Two kernels with the same key are interchangeable.

    `gpu` is canonicalised (canonical_gpu), `arch` loses any underscore (sm_90a -> sm90a)
    and dtype aliases (fp32, bf16, ...) become torch names on construction; every field
    is checked.

    >>> KernelKey(rule="gemm", arch="sm90a", gpu="NVIDIA H100 80GB HBM3", dtype_in="float32",
    ...           dtype_acc="float32", dtype_out="float32", layout_a="row", layout_b="col",
    ...           m=4096, n=4096, k=4096, batch=1, epilogue="none", policy="fp32").gpu
    'h100'
    """

    rule: str
    arch: str
    gpu: str
    dtype_in: str
    dtype_acc: str
    dtype_out: str
    layout_a: str
    layout_b: str
    m: int
    n: int
    k: int
    batch: int
    epilogue: str
    policy: str

    def __post_init__(self):
        for name in ("rule", "arch", "gpu", "dtype_in", "dtype_acc", "dtype_out", "layout_a", "layout_b",
                     "epilogue", "policy"):
            v = getattr(self, name)
            if not isinstance(v, str) or not v:
                raise RegistryError(f"key field {name} must be a non-empty string, got {v!r}")
        object.__setattr__(self, "gpu", canonical_gpu(self.gpu))
        for name in ("dtype_in", "dtype_acc", "dtype_out"):
            v = _DTYPE_ALIASES.get(getattr(self, name), getattr(self, name))
            if v not in DTYPES:
                raise RegistryError(f"key field {name} is {v!r}; use one of {', '.join(DTYPES)}")
            object.__setattr__(self, name, v)
        for name in ("layout_a", "layout_b"):
            if getattr(self, name) not in ("row", "col"):
                raise RegistryError(f"key field {name} is {getattr(self, name)!r}; use row or col")
        if self.policy not in POLICIES:
            raise RegistryError(f"key field policy is {self.policy!r}; use one of {', '.join(POLICIES)}")
        if not _ARCH.fullmatch(self.arch):
            raise RegistryError(f"key field arch is {self.arch!r}; use a compute capability such as sm90a or sm80")
        object.__setattr__(self, "arch", self.arch.replace("_", ""))   # sm_90a -> sm90a
        for name in ("rule", "epilogue"):
            if not _SLUG.fullmatch(getattr(self, name)):
                raise RegistryError(f"key field {name} is {getattr(self, name)!r}; use lowercase letters, digits, "
                                    "'-' and '_' (e.g. gemm-bias-gelu-tanh, bias_gelu_tanh)")
        for name in ("m", "n", "k", "batch"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise RegistryError(f"key field {name} must be a positive integer, got {v!r}")

    FIELDS = ("rule", "arch", "gpu", "dtype_in", "dtype_acc", "dtype_out", "layout_a", "layout_b",
              "m", "n", "k", "batch", "epilogue", "policy")

    def digest(self) -> str:
        """16 hex digits of sha256 over the fields in declaration order: the registry's primary key.

        Stable across versions and machines; the JSONL files carry it.
        """
        text = json.dumps([getattr(self, f) for f in self.FIELDS], separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    @property
    def shape(self) -> str:
        return f"{self.m}x{self.n}x{self.k}" + (f"x{self.batch}" if self.batch > 1 else "")

    @property
    def div_classes(self) -> tuple[int, int, int]:
        return _div_class(self.m), _div_class(self.n), _div_class(self.k)

    def family(self) -> str:
        """16 hex digits over the non-shape fields and the M/N/K divisibility classes: the rows a
        nearest-shape lookup may return share it (an indexed column)."""
        text = json.dumps([getattr(self, f) for f in _NON_SHAPE] + list(self.div_classes), separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def as_dict(self) -> dict:
        return {f: getattr(self, f) for f in self.FIELDS}

    def with_(self, **changes) -> KernelKey:
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_dict(cls, d: dict) -> KernelKey:
        missing = [f for f in cls.FIELDS if f not in d]
        if missing:
            raise RegistryError(f"key fields missing: {', '.join(missing)}")
        return cls(**{f: d[f] for f in cls.FIELDS})

    @staticmethod
    def parse_shape(text: str) -> tuple[int, int, int, int]:
        """`MxNxK` or `MxNxKxB` -> (M, N, K, batch); batch is 1 when absent.

        >>> KernelKey.parse_shape("512x2048x1024x8")
        (512, 2048, 1024, 8)
        """
        m = re.fullmatch(r"\s*(\d+)\s*[xX]\s*(\d+)\s*[xX]\s*(\d+)\s*(?:[xX]\s*(\d+)\s*)?", text or "")
        if not m:
            raise RegistryError(f"shape {text!r} is not MxNxK or MxNxKxB; write e.g. 4096x4096x4096, or "
                                "512x2048x1024x8 for a batch of 8")
        dims = tuple(int(g) if g else 1 for g in m.groups())
        if min(dims) < 1:
            raise RegistryError(f"shape {text!r}: every dimension must be at least 1")
        return dims  # type: ignore[return-value]

    def distance(self, other: KernelKey) -> float:
        """Sum of |log2 ratio| over M, N, K and batch (shape only; see the module docstring)."""
        return sum(abs(math.log2(getattr(self, f) / getattr(other, f))) for f in ("m", "n", "k", "batch"))

    def compatible(self, other: KernelKey) -> bool:
        """Same non-shape fields and the same divisibility classes of M, N and K."""
        same = all(getattr(self, f) == getattr(other, f) for f in _NON_SHAPE)
        return same and self.div_classes == other.div_classes


_NON_SHAPE = tuple(f for f in KernelKey.FIELDS if f not in ("m", "n", "k", "batch"))


# --------------------------------------------------------------------------------------
# records

def utcnow() -> str:
    """Now, UTC, ISO 8601 with microseconds and a Z: sorts as text."""
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _norm_time(value) -> str:
    if not value:
        return utcnow()
    if not isinstance(value, str):
        raise RegistryError(f"created_at must be an ISO 8601 string, got {value!r}")
    try:
        dt = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise RegistryError(f"created_at {value!r} is not an ISO 8601 time such as 2026-11-22T10:00:00Z") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return dt.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def config_hash(config: dict) -> str:
    """16 hex digits of sha256 over the config as canonical JSON (sorted keys)."""
    return hashlib.sha256(json.dumps(config, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]


def _num(name: str, v, *, positive=False):
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise RegistryError(f"{name} must be a finite number or null, got {v!r}")
    if v < 0 or (positive and v == 0):
        raise RegistryError(f"{name} must be {'positive' if positive else 'non-negative'}, got {v!r}")
    return float(v)


def _text(name: str, v) -> str:
    if v is None:
        return ""
    if not isinstance(v, str):
        raise RegistryError(f"{name} must be a string, got {v!r}")
    return v


@dataclass(frozen=True)
class KernelRecord:
    """A tuned winner for one key. `stamped()` fills the toolchain fields from what is installed.

    `time_ms` is the median; `rel_err` the error vs the float64 reference, `baseline_*`
    the same for the baseline (e.g. "torch eager") measured in the same run.
    """

    key: KernelKey
    template: str
    config: dict = field(default_factory=dict)
    time_ms: float | None = None
    baseline: str = ""
    baseline_ms: float | None = None
    rel_err: float | None = None
    baseline_rel_err: float | None = None
    status: str = "verified"
    provenance: str = "rule"
    source_hash: str = ""
    template_hash: str = ""
    cutlass_version: str = ""
    nvcc_version: str = ""
    factdb_version: str = ""
    device_name: str = ""
    error: str = ""
    stale_reason: str = ""
    notes: str = ""
    created_at: str = ""
    updated_at: str = ""

    def __post_init__(self):
        if not isinstance(self.key, KernelKey):
            raise RegistryError(f"key must be a KernelKey, got {type(self.key).__name__}")
        if not isinstance(self.template, str) or not _SLUG.fullmatch(self.template):
            raise RegistryError(f"template {self.template!r} is not a template name such as gemm_sm90")
        if not isinstance(self.config, dict):
            raise RegistryError(f"config must be a JSON object, got {self.config!r}")
        try:
            json.dumps(self.config, allow_nan=False)
        except (TypeError, ValueError) as e:
            raise RegistryError(f"config is not plain JSON ({e})") from None
        if self.status not in KERNEL_STATUSES:
            raise RegistryError(f"status {self.status!r} is not one of {', '.join(KERNEL_STATUSES)}")
        if self.provenance not in PROVENANCES:
            raise RegistryError(f"provenance {self.provenance!r} is not one of {', '.join(PROVENANCES)}")
        for name in ("time_ms", "baseline_ms"):
            object.__setattr__(self, name, _num(name, getattr(self, name), positive=True))
        for name in ("rel_err", "baseline_rel_err"):
            object.__setattr__(self, name, _num(name, getattr(self, name)))
        if self.status == "verified" and self.time_ms is None:
            raise RegistryError("a verified kernel needs time_ms (its median time); record it or use status failed")
        for name in ("baseline", "source_hash", "template_hash", "cutlass_version", "nvcc_version", "factdb_version",
                     "device_name", "error", "stale_reason", "notes"):
            object.__setattr__(self, name, _text(name, getattr(self, name)))
        object.__setattr__(self, "created_at", _norm_time(self.created_at))
        object.__setattr__(self, "updated_at", _norm_time(self.updated_at or self.created_at))

    @property
    def digest(self) -> str:
        return self.key.digest()

    @property
    def speedup(self) -> float | None:
        return self.baseline_ms / self.time_ms if self.time_ms and self.baseline_ms else None

    def toolchain_tuple(self) -> tuple[str, str, str]:
        return self.cutlass_version, self.nvcc_version, self.template_hash

    def stamped(self, toolchain=None, template_hash: str | None = None) -> KernelRecord:
        """A copy with the toolchain fields set from `toolchain` (default: installed now)."""
        return dataclasses.replace(self, **_stamp(self.template, toolchain, template_hash))

    def replace(self, **changes) -> KernelRecord:
        return dataclasses.replace(self, **changes)

    def as_dict(self) -> dict:
        """Flat: digest, the key fields, then the rest (the JSONL form)."""
        d = {"digest": self.digest, **self.key.as_dict()}
        for f in dataclasses.fields(self):
            if f.name != "key":
                d[f.name] = getattr(self, f.name)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> KernelRecord:
        """The inverse of as_dict; checks every field, and the digest when present."""
        if not isinstance(d, dict):
            raise RegistryError(f"a kernel row must be a JSON object, got {type(d).__name__}")
        known = set(KernelKey.FIELDS) | {f.name for f in dataclasses.fields(cls)} | {"digest"}
        unknown = sorted(set(d) - known)
        if unknown:
            raise RegistryError(f"unknown fields {', '.join(unknown)} (a newer fact-db's export, or a typo)")
        key = KernelKey.from_dict(d)
        if "template" not in d:
            raise RegistryError("field template is missing")
        rest = {k: v for k, v in d.items() if k not in KernelKey.FIELDS and k != "digest"}
        rec = cls(key=key, **rest)
        if "digest" in d and d["digest"] != rec.digest:
            raise RegistryError(f"digest {d['digest']!r} does not match the key fields (they give {rec.digest!r}); "
                                "drop the digest field or fix the key")
        return rec


@dataclass(frozen=True)
class TrialRecord:
    """One candidate tried for a key, whatever became of it (status), under one toolchain."""

    key: KernelKey
    template: str
    config: dict
    status: str
    time_ms: float | None = None
    rel_err: float | None = None
    error: str = ""          # the first error line, or the nvcc command that failed
    config_hash: str = ""    # computed from config when empty
    template_hash: str = ""
    cutlass_version: str = ""
    nvcc_version: str = ""
    factdb_version: str = ""
    device_name: str = ""
    created_at: str = ""
    id: str = ""

    def __post_init__(self):
        if not isinstance(self.key, KernelKey):
            raise RegistryError(f"key must be a KernelKey, got {type(self.key).__name__}")
        if self.status not in TRIAL_STATUSES:
            raise RegistryError(f"trial status {self.status!r} is not one of {', '.join(TRIAL_STATUSES)}")
        if not isinstance(self.config, dict):
            raise RegistryError(f"trial config must be a JSON object, got {self.config!r}")
        object.__setattr__(self, "time_ms", _num("time_ms", self.time_ms))
        object.__setattr__(self, "rel_err", _num("rel_err", self.rel_err))
        object.__setattr__(self, "config_hash", self.config_hash or config_hash(self.config))
        object.__setattr__(self, "created_at", _norm_time(self.created_at))
        object.__setattr__(self, "id", self.id or uuid.uuid4().hex)

    @property
    def digest(self) -> str:
        return self.key.digest()

    def stamped(self, toolchain=None, template_hash: str | None = None) -> TrialRecord:
        return dataclasses.replace(self, **_stamp(self.template, toolchain, template_hash))

    def as_dict(self) -> dict:
        d = {"digest": self.digest, **self.key.as_dict()}
        for f in dataclasses.fields(self):
            if f.name != "key":
                d[f.name] = getattr(self, f.name)
        return d


def _stamp(template: str, toolchain, template_hash: str | None) -> dict:
    from fact_db.core import toolchain as tc_mod
    tc = toolchain or tc_mod.current()
    th = template_hash if template_hash is not None else tc_mod.template_hash(template)
    return {"cutlass_version": tc.cutlass, "nvcc_version": tc.nvcc, "factdb_version": tc.factdb, "template_hash": th}


@dataclass(frozen=True)
class RuleRecord:
    """A rule as the index sees it (thin: the YAML file stays the source of truth)."""

    id: str
    family: str = ""
    title: str = ""
    path: str = ""
    hash: str = ""
    template: str = ""
    status: str = ""


@dataclass(frozen=True)
class ExampleRecord:
    """A vetted CUTLASS example as the index sees it."""

    id: str
    kind: str = ""
    title: str = ""
    source_path: str = ""
    hash: str = ""
    arch: str = ""
    notes: str = ""


@dataclass(frozen=True)
class Lookup:
    """A registry answer: the row, how far its shape is from the one asked for, and whether it is usable."""

    record: KernelRecord
    distance: float
    exact: bool
    stale: bool
    stale_reason: str = ""

    @property
    def usable(self) -> bool:
        return not self.stale

    def __str__(self) -> str:
        kind = "exact" if self.exact else f"nearest (distance {self.distance:.2f})"
        return f"{kind} {self.record.digest} {self.record.key.shape}" + (f" STALE: {self.stale_reason}"
                                                                          if self.stale else "")


@dataclass
class ImportReport:
    inserted: int = 0
    replaced: int = 0
    kept: int = 0
    path: str = ""

    @property
    def total(self) -> int:
        return self.inserted + self.replaced + self.kept

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Change:
    """One row revalidate changed (or, with dry_run, would change)."""

    digest: str
    rule: str
    shape: str
    old_status: str
    new_status: str
    reason: str

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass
class GcReport:
    kernels: list[str] = field(default_factory=list)   # digests deleted (or, dry run, to delete)
    trials: int = 0
    dry_run: bool = False

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


class ImportError_(RegistryError):
    """A JSONL file had malformed lines; nothing from it was applied. `problems`: [(line, reason)]."""

    def __init__(self, path: str, problems: list[tuple[int, str]], fix: str = "fix them and import again"):
        self.path = path
        self.problems = list(problems)
        listed = "; ".join(f"line {n}: {why}" for n, why in self.problems)
        super().__init__(f"{path}: {len(self.problems)} bad line{'s' if len(self.problems) != 1 else ''}, nothing "
                         f"imported ({listed}); {fix}")


# --------------------------------------------------------------------------------------
# storage models (SQLModel, their own metadata: the index's SQLModel.metadata.create_all
# never creates these; fact_db.store.db's migrations do)

class _Base(SQLModel, registry=_sa_registry()):
    pass


class KernelRow(_Base, table=True):
    __tablename__ = "kernels"
    digest: str = Field(primary_key=True)
    rule: str
    arch: str
    gpu: str
    dtype_in: str
    dtype_acc: str
    dtype_out: str
    layout_a: str
    layout_b: str
    m: int = Field(sa_type=sa.BigInteger)
    n: int = Field(sa_type=sa.BigInteger)
    k: int = Field(sa_type=sa.BigInteger)
    batch: int = Field(sa_type=sa.BigInteger)
    epilogue: str
    policy: str
    m_div: int
    n_div: int
    k_div: int
    family: str = Field(index=True)
    template: str
    config: str = Field(sa_type=sa.Text)
    source_hash: str
    template_hash: str
    cutlass_version: str
    nvcc_version: str
    factdb_version: str
    time_ms: float | None = Field(default=None, sa_type=sa.Double)
    baseline: str
    baseline_ms: float | None = Field(default=None, sa_type=sa.Double)
    rel_err: float | None = Field(default=None, sa_type=sa.Double)
    baseline_rel_err: float | None = Field(default=None, sa_type=sa.Double)
    device_name: str
    provenance: str
    status: str
    stale_reason: str = Field(sa_type=sa.Text)
    error: str = Field(sa_type=sa.Text)
    created_at: str
    updated_at: str
    notes: str = Field(sa_type=sa.Text)


class TrialRow(_Base, table=True):
    __tablename__ = "trials"
    id: str = Field(primary_key=True)
    digest: str
    rule: str
    arch: str
    gpu: str
    dtype_in: str
    dtype_acc: str
    dtype_out: str
    layout_a: str
    layout_b: str
    m: int = Field(sa_type=sa.BigInteger)
    n: int = Field(sa_type=sa.BigInteger)
    k: int = Field(sa_type=sa.BigInteger)
    batch: int = Field(sa_type=sa.BigInteger)
    epilogue: str
    policy: str
    template: str
    config: str = Field(sa_type=sa.Text)
    config_hash: str
    status: str
    time_ms: float | None = Field(default=None, sa_type=sa.Double)
    rel_err: float | None = Field(default=None, sa_type=sa.Double)
    error: str = Field(sa_type=sa.Text)
    template_hash: str
    cutlass_version: str
    nvcc_version: str
    factdb_version: str
    device_name: str
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


class MetaRow(_Base, table=True):
    __tablename__ = "factdb_meta"
    key: str = Field(primary_key=True)
    value: str = Field(sa_type=sa.Text)


METADATA = _Base.metadata
K = KernelRow.__table__
TR = TrialRow.__table__


def _kernel_row(rec: KernelRecord) -> dict:
    d = rec.key.as_dict()
    d["digest"] = rec.digest
    d["m_div"], d["n_div"], d["k_div"] = rec.key.div_classes
    d["family"] = rec.key.family()
    for f in dataclasses.fields(rec):
        if f.name != "key":
            d[f.name] = getattr(rec, f.name)
    d["config"] = json.dumps(rec.config, sort_keys=True, separators=(",", ":"))
    return d


def _kernel_record(row) -> KernelRecord:
    m = row._mapping if hasattr(row, "_mapping") else row
    key = KernelKey(**{f: m[f] for f in KernelKey.FIELDS})
    rest = {f.name: m[f.name] for f in dataclasses.fields(KernelRecord) if f.name != "key"}
    rest["config"] = json.loads(rest["config"])
    return KernelRecord(key=key, **rest)


_RECORD_FIELDS = tuple(f.name for f in dataclasses.fields(KernelRecord) if f.name != "key")


def _export_dict(m) -> dict:
    """KernelRecord.as_dict() of a stored row, without rebuilding (and re-checking) the record."""
    d = {"digest": m["digest"], **{f: m[f] for f in KernelKey.FIELDS}, **{f: m[f] for f in _RECORD_FIELDS}}
    d["config"] = json.loads(d["config"])
    return d


def _trial_row(rec: TrialRecord) -> dict:
    d = rec.key.as_dict()
    d["digest"] = rec.digest
    for f in dataclasses.fields(rec):
        if f.name != "key":
            d[f.name] = getattr(rec, f.name)
    d["config"] = json.dumps(rec.config, sort_keys=True, separators=(",", ":"))
    return d


def _trial_record(row) -> TrialRecord:
    m = row._mapping
    key = KernelKey(**{f: m[f] for f in KernelKey.FIELDS})
    rest = {f.name: m[f.name] for f in dataclasses.fields(TrialRecord) if f.name != "key"}
    rest["config"] = json.loads(rest["config"])
    return TrialRecord(key=key, **rest)


# --------------------------------------------------------------------------------------
# staleness and merge (pure functions: tested without a database)

class Current:
    """The toolchain to judge rows against: versions now, and template hashes (computed once each)."""

    def __init__(self, toolchain=None, template_hashes: dict[str, str] | None = None):
        from fact_db.core import toolchain as tc_mod
        self.toolchain = toolchain or tc_mod.current()
        self._hashes = dict(template_hashes or {})
        self._explicit = template_hashes is not None

    def template_hash(self, name: str) -> str:
        if name not in self._hashes:
            from fact_db.core import toolchain as tc_mod
            self._hashes[name] = tc_mod.template_hash(name)
        return self._hashes[name]

    def mismatch(self, template: str, template_hash: str, cutlass: str, nvcc: str) -> str:
        """Why a row built with these is stale now, or "" when it is current."""
        why = []
        tc = self.toolchain
        if cutlass != tc.cutlass:
            why.append(f"built with CUTLASS {cutlass or '(none)'}, now {tc.cutlass or '(none)'}")
        if nvcc != tc.nvcc:
            why.append(f"built with nvcc {nvcc or '(none)'}, now {nvcc_now(tc)}")
        now = self.template_hash(template)
        if template_hash != now:
            why.append(f"template {template} no longer exists" if not now else
                       f"template {template} changed (hash {template_hash or '(none)'}, now {now})")
        return "; ".join(why)

    def staleness(self, rec: KernelRecord) -> str:
        """Why `rec` is not usable now, or "" when it is."""
        live = self.mismatch(rec.template, rec.template_hash, rec.cutlass_version, rec.nvcc_version)
        if rec.status == "stale" and not live:
            return (f"marked stale ({rec.stale_reason or 'no reason recorded'}); its toolchain matches now, so "
                    "`factdb registry revalidate` will restore it")
        return live


def nvcc_now(tc) -> str:
    return tc.nvcc or "(none: nvcc not on PATH)"


def _same(a: KernelRecord, b: KernelRecord) -> bool:
    return dataclasses.replace(a, updated_at=b.updated_at) == b


def _rank(rec: KernelRecord, cur: Current) -> int:
    if rec.status == "failed":
        return 0
    if rec.status == "verified" and not cur.staleness(rec):
        return 2
    return 1


def merge_decision(old: KernelRecord | None, new: KernelRecord, cur: Current) -> str:
    """'inserted', 'replaced' or 'kept' for `new` arriving where `old` is (same key); see the module docstring."""
    if old is None:
        return "inserted"
    if _same(old, new):
        return "kept"
    ro, rn = _rank(old, cur), _rank(new, cur)
    if rn != ro:
        return "replaced" if rn > ro else "kept"
    if old.status == "verified" and new.status != "verified":
        return "kept"
    if new.status == "verified" and old.status != "verified":
        return "replaced"
    if rn > 0 and old.toolchain_tuple() == new.toolchain_tuple():
        faster = new.time_ms is not None and (old.time_ms is None or new.time_ms < old.time_ms)
        return "replaced" if faster else "kept"
    return "replaced" if new.created_at > old.created_at else "kept"


# --------------------------------------------------------------------------------------

def seed_path() -> Path | None:
    """The seed registry imported into a new database: $FACTDB_SEED (empty: none), else index/kernels.jsonl."""
    env = os.environ.get("FACTDB_SEED")
    if env is not None:
        return Path(env) if env else None
    return paths.ROOT / "index" / "kernels.jsonl"


_KERNEL_FILTERS = ("rule", "arch", "gpu", "policy", "status", "dtype_in", "dtype_out", "epilogue", "provenance",
                   "template", "layout_a", "layout_b", "m", "n", "k", "batch")


class Registry:
    """The kernel registry over a fact-db database (DuckDB file by default, any SQLAlchemy URL).

    Every method opens a connection for one transaction and closes it, so other
    processes can use the file in between; see fact_db.store.db for locking and timeouts.

    >>> with Registry.open("memory") as reg:
    ...     reg.put_kernel(record)
    'inserted'
    """

    def __init__(self, db: Database):
        self.db = db
        self._toolchain = None

    def _cur(self, toolchain, template_hashes) -> Current:
        if toolchain is None:
            if self._toolchain is None:
                from fact_db.core import toolchain as tc_mod
                self._toolchain = tc_mod.current()
            toolchain = self._toolchain
        return Current(toolchain, template_hashes)

    # ----------------------------------------------------------------------------------
    @classmethod
    def open(cls, url: str | None = None, *, timeout: float | None = None,
             seed: str | os.PathLike | bool | None = None) -> Registry:
        """Open the registry at `url` (None: $FACTDB_DB, else $FACTDB_HOME/fact.duckdb; "memory": in-memory).

        A new database is created and migrated; the seed file (`seed`, default
        seed_path(), not for in-memory databases; False: none) is imported whenever its
        content differs from the last one imported. `timeout` (default
        $FACTDB_DB_TIMEOUT, else 30 s) bounds the wait for another process's lock.
        """
        db = Database.open(url, timeout=timeout)
        reg = cls(db)
        try:
            if seed is None and not db.memory:
                seed = seed_path()
            if seed:
                reg._maybe_seed(Path(seed))
        except BaseException:
            db.close()
            raise
        return reg

    @classmethod
    def memory(cls, *, seed: str | os.PathLike | bool | None = None) -> Registry:
        """A fresh in-memory registry (tests, dry runs)."""
        return cls.open("memory", seed=seed)

    @property
    def url(self) -> str:
        return self.db.url

    @property
    def where(self) -> str:
        return self.db.where

    def close(self) -> None:
        self.db.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def transaction(self, write: bool = True):
        """A short SQLAlchemy transaction on this database (for fact_db.store.index's own tables)."""
        return self.db.begin(write=write)

    def meta(self) -> dict[str, str]:
        from fact_db.store.db import read_meta
        with self.db.begin(write=False) as conn:
            return read_meta(conn)

    # ----------------------------------------------------------------------------------
    def _maybe_seed(self, path: Path) -> None:
        if not path.is_file():
            return
        data = path.read_bytes()
        sha = hashlib.sha256(data).hexdigest()
        if self.db.meta.get("seed_sha256") == sha:
            return
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise RegistryError(f"seed file {path} is not UTF-8 text ({e.reason} at byte {e.start}); fix it, or set "
                                "FACTDB_SEED to another file (empty: no seed)") from None
        try:
            records = _parse_jsonl(io.StringIO(text), str(path), provenance="seed")
        except ImportError_ as e:
            raise ImportError_(e.path, e.problems, "fix the seed file, or set FACTDB_SEED to another file (empty: "
                               "no seed)") from None
        from fact_db.store.db import read_meta
        with self.db.begin() as conn:
            if read_meta(conn).get("seed_sha256") == sha:  # another process seeded it meanwhile
                return
            _merge_into(conn, records, self._cur(None, None))
            write_meta(conn, seed_sha256=sha, seed_path=str(path), seeded_at=utcnow())
        self.db.meta["seed_sha256"] = sha

    # ----------------------------------------------------------------------------------
    # attention rows (fact_db/kernels/attention/tune.py): one per workload key, the winner and its trials
    @staticmethod
    def attention_digest(w, arch: str, gpu: str = "") -> str:
        key = (arch, canonical_gpu(gpu) if gpu else "", w.batch, w.heads, w.kv_heads, w.lq, w.lk, w.d, w.dv,
               bool(w.causal), float(w.softmax_scale), w.dtype, w.policy)
        return hashlib.sha256(json.dumps(key).encode()).hexdigest()[:32]

    def attention_get(self, w, arch: str, gpu: str = ""):
        """The stored winner for attention workload `w` (an AttnTrial), or None."""
        import sqlalchemy as sa

        from fact_db.kernels.attention.tune import AttnTrial
        with self.db.begin(write=False) as conn:
            row = conn.execute(sa.text("SELECT label, kind, template, config, time_ms, rel_err FROM attention_kernels "
                                       "WHERE digest = :d"), {"d": self.attention_digest(w, arch, gpu)}).first()
        if row is None:
            return None
        return AttnTrial(row[0], row[1], "ok", time_ms=row[4], err=row[5], template=row[2],
                         config=json.loads(row[3]) if row[3] else {})

    def attention_put(self, w, arch: str, best, trials, gpu: str = "", device_name: str = "") -> None:
        """Store (replace) the winner for `w`, with every trial."""
        import dataclasses

        import sqlalchemy as sa
        digest = self.attention_digest(w, arch, gpu)
        row = {"digest": digest, "arch": arch, "gpu": canonical_gpu(gpu) if gpu else "", "batch": w.batch,
               "heads": w.heads, "kv_heads": w.kv_heads, "lq": w.lq, "lk": w.lk, "d": w.d, "dv": w.dv,
               "causal": bool(w.causal), "scale": float(w.softmax_scale), "dtype": w.dtype, "policy": w.policy,
               "label": best.label, "kind": best.kind, "template": best.template or "",
               "config": json.dumps(best.config or {}, sort_keys=True), "time_ms": best.time_ms, "rel_err": best.err,
               "device_name": device_name,
               "trials": json.dumps([dataclasses.asdict(t) for t in trials], default=str), "created_at": utcnow()}
        cols = ", ".join(row)
        vals = ", ".join(f":{k}" for k in row)
        with self.db.begin() as conn:
            conn.execute(sa.text("DELETE FROM attention_kernels WHERE digest = :d"), {"d": digest})
            conn.execute(sa.text(f"INSERT INTO attention_kernels ({cols}) VALUES ({vals})"), row)

    # ----------------------------------------------------------------------------------
    def put_kernel(self, rec: KernelRecord, *, toolchain=None, template_hashes: dict | None = None) -> str:
        """Merge one kernel row by key: 'inserted', 'replaced' or 'kept' (see the module docstring)."""
        return self.put_kernels([rec], toolchain=toolchain, template_hashes=template_hashes).outcomes[0]

    def put_kernels(self, recs: Iterable[KernelRecord], *, toolchain=None,
                    template_hashes: dict | None = None) -> MergeResult:
        """Merge many kernel rows in one transaction; returns counts and per-row outcomes."""
        recs = list(recs)
        for r in recs:
            if not isinstance(r, KernelRecord):
                raise RegistryError(f"put_kernel takes KernelRecord, got {type(r).__name__}")
        cur = self._cur(toolchain, template_hashes)
        with self.db.begin() as conn:
            return _merge_into(conn, recs, cur)

    def add_trials(self, recs: Iterable[TrialRecord]) -> int:
        """Record tried candidates (failures included). Returns how many were written."""
        rows = []
        for r in recs:
            if not isinstance(r, TrialRecord):
                raise RegistryError(f"add_trials takes TrialRecord, got {type(r).__name__}")
            rows.append(_trial_row(r))
        if rows:
            with self.db.begin() as conn:
                _insert(conn, TR, rows)
        return len(rows)

    def get(self, key_or_digest: KernelKey | str) -> KernelRecord | None:
        """The row stored for exactly this key (or digest), whatever its status."""
        digest = key_or_digest.digest() if isinstance(key_or_digest, KernelKey) else key_or_digest
        with self.db.begin(write=False) as conn:
            row = conn.execute(sa.select(K).where(K.c.digest == digest)).first()
        return _kernel_record(row) if row else None

    def find_digest(self, prefix: str) -> list[str]:
        """Digests starting with `prefix` (like a short git hash)."""
        with self.db.begin(write=False) as conn:
            rows = conn.execute(sa.select(K.c.digest).where(K.c.digest.startswith(prefix, autoescape=True))
                                .order_by(K.c.digest).limit(20)).all()
        return [r[0] for r in rows]

    def lookup(self, key: KernelKey, toolchain=None, template_hashes: dict | None = None, *,
               max_distance: float | None = None) -> Lookup | None:
        """The registry's answer for `key`: the exact row, else the nearest compatible shape, else None.

        See the module docstring for compatibility and distance. `toolchain` (default:
        installed now) and `template_hashes` (template -> hash; default: hashed from
        kernels_cpp/) decide staleness. A stale row is returned flagged, never as usable.
        """
        cur = self._cur(toolchain, template_hashes)
        with self.db.begin(write=False) as conn:
            found = _nearest(conn, key, cur, max_distance)
        if found is None:
            return None
        rec, d = found
        why = cur.staleness(rec)
        return Lookup(rec, d, d == 0.0, bool(why), why)

    def pinned(self, write: bool = False):
        """Hold one connection for a batch of calls (e.g. a lookup per region), then release it.

        Calls inside reuse it: no reopening, warm caches. Meanwhile no other process can
        write the DuckDB file (with write=True, nor read it), so keep the block short.

        >>> with reg.pinned():
        ...     hits = [reg.lookup(k) for k in keys]
        """
        return self.db.pinned(write)

    def kernels(self, **filters) -> Iterator[KernelRecord]:
        """Kernel rows, optionally filtered by equality on rule, arch, gpu, policy, status, dtype_in, ...

        >>> [r.key.shape for r in reg.kernels(rule="gemm", gpu="h100", status="verified")]
        """
        stmt = sa.select(K).where(*self._filters(filters)).order_by(K.c.rule, K.c.m, K.c.n, K.c.k, K.c.digest)
        with self.db.begin(write=False) as conn:
            rows = conn.execute(stmt).all()
        return (_kernel_record(r) for r in rows)

    def count(self, **filters) -> int:
        with self.db.begin(write=False) as conn:
            return conn.execute(sa.select(sa.func.count()).select_from(K).where(*self._filters(filters))).scalar()

    @staticmethod
    def _filters(filters: dict) -> list:
        bad = sorted(set(filters) - set(_KERNEL_FILTERS))
        if bad:
            raise RegistryError(f"cannot filter kernels by {', '.join(bad)}; filters are {', '.join(_KERNEL_FILTERS)}")
        conds = []
        for name, value in filters.items():
            if value is None:
                continue
            if name == "gpu":
                value = canonical_gpu(value)
            elif name in ("dtype_in", "dtype_out"):
                value = _DTYPE_ALIASES.get(value, value)
            conds.append(K.c[name] == value)
        return conds

    def trials(self, key_or_digest: KernelKey | str) -> list[TrialRecord]:
        """Every trial recorded for a key, oldest first."""
        digest = key_or_digest.digest() if isinstance(key_or_digest, KernelKey) else key_or_digest
        with self.db.begin(write=False) as conn:
            rows = conn.execute(sa.select(TR).where(TR.c.digest == digest).order_by(TR.c.created_at, TR.c.id)).all()
        return [_trial_record(r) for r in rows]

    def failed_configs(self, key: KernelKey, toolchain=None, template_hashes: dict | None = None) -> set[str]:
        """Config hashes that failed for this key under this same toolchain (do not try them again).

        Failures are every trial status but ok and skipped. A failure under another
        CUTLASS, nvcc or template version does not count: the new toolchain may fix it.
        """
        cur = self._cur(toolchain, template_hashes)
        with self.db.begin(write=False) as conn:
            rows = conn.execute(sa.select(TR.c.config_hash, TR.c.template, TR.c.template_hash, TR.c.cutlass_version,
                                          TR.c.nvcc_version)
                                .where(TR.c.digest == key.digest(), TR.c.status.in_(sorted(TRIAL_FAILURES)))).all()
        return {r.config_hash for r in rows
                if not cur.mismatch(r.template, r.template_hash, r.cutlass_version, r.nvcc_version)}

    # ----------------------------------------------------------------------------------
    def export_jsonl(self, path_or_file: str | os.PathLike | IO[str], **filters) -> int:
        """Write kernel rows (filtered as in kernels()) as JSON lines, sorted by digest. Returns the count.

        "-" writes to stdout. The format is what import_jsonl and the seed file read.
        """
        stmt = sa.select(K).where(*self._filters(filters)).order_by(K.c.digest)
        with self.db.begin(write=False) as conn:
            rows = conn.execute(stmt).all()
        lines = "".join(json.dumps(_export_dict(r._mapping), separators=(", ", ": ")) + "\n" for r in rows)
        if hasattr(path_or_file, "write"):
            path_or_file.write(lines)
        elif str(path_or_file) == "-":
            sys.stdout.write(lines)
        else:
            p = Path(path_or_file)
            tmp = p.with_name(p.name + ".tmp")
            tmp.write_text(lines)
            os.replace(tmp, p)
        return len(rows)

    def import_jsonl(self, path: str | os.PathLike | IO[str], *, toolchain=None,
                     template_hashes: dict | None = None) -> ImportReport:
        """Merge the kernel rows of a JSONL file, all or nothing.

        Every line is checked first; if any is malformed, ImportError_ lists every bad
        line with its reason and nothing is applied. Rows without provenance get "import".
        """
        if hasattr(path, "read"):
            name = getattr(path, "name", "<stream>")
            records = _parse_jsonl(path, str(name), provenance="import")
        elif str(path) == "-":
            name = "<stdin>"
            records = _parse_jsonl(sys.stdin, name, provenance="import")
        else:
            name = str(path)
            try:
                with open(path, encoding="utf-8") as f:
                    records = _parse_jsonl(f, name, provenance="import")
            except FileNotFoundError:
                raise RegistryError(f"{name} does not exist; pass a JSONL file written by `factdb registry export`") \
                    from None
            except UnicodeDecodeError as e:
                raise RegistryError(f"{name} is not UTF-8 text ({e.reason} at byte {e.start}); pass a JSONL file "
                                    "written by `factdb registry export`") from None
        res = self.put_kernels(records, toolchain=toolchain, template_hashes=template_hashes)
        return ImportReport(res.inserted, res.replaced, res.kept, name)

    # ----------------------------------------------------------------------------------
    def revalidate(self, toolchain=None, *, template_hashes: dict | None = None,
                   recheck: Callable[[KernelRecord, str], KernelRecord | None] | None = None,
                   dry_run: bool = False) -> list[Change]:
        """Mark rows stale whose CUTLASS, nvcc or template hash differs from `toolchain` (default: now).

        A stale row whose recorded toolchain matches again becomes verified again.
        `recheck(record, reason)`, when given (e.g. GPU re-verification), is called for
        every stale row; a KernelRecord it returns (same key) replaces the row as is,
        None leaves it stale. Returns what changed.
        """
        cur = self._cur(toolchain, template_hashes)
        changes: list[Change] = []
        updates: dict[tuple[str, str], list[str]] = {}   # (new status, reason) -> digests
        replacements: list[KernelRecord] = []
        cols = (K.c.digest, K.c.rule, K.c.m, K.c.n, K.c.k, K.c.batch, K.c.status, K.c.stale_reason, K.c.template,
                K.c.template_hash, K.c.cutlass_version, K.c.nvcc_version)
        with self.db.begin(write=False) as conn:
            rows = conn.execute(sa.select(*cols).where(K.c.status != "failed").order_by(K.c.digest)).all()
        for r in rows:
            shape = f"{r.m}x{r.n}x{r.k}" + (f"x{r.batch}" if r.batch > 1 else "")
            why = cur.mismatch(r.template, r.template_hash, r.cutlass_version, r.nvcc_version)
            if not why and r.status == "verified":
                continue
            if not why and recheck is None:   # stale, and its toolchain matches again
                updates.setdefault(("verified", ""), []).append(r.digest)
                changes.append(Change(r.digest, r.rule, shape, "stale", "verified",
                                      "its toolchain and template match again"))
                continue
            why = why or r.stale_reason or "marked stale"
            if recheck is not None and not dry_run:
                rec = self.get(r.digest)
                new = recheck(rec, why)
                if new is not None:
                    if new.digest != rec.digest:
                        raise RegistryError(f"recheck returned a row for key {new.digest}, not {rec.digest}; "
                                            "return a record with the same key")
                    replacements.append(new.replace(updated_at=utcnow()))
                    changes.append(Change(r.digest, r.rule, shape, r.status, new.status, f"rechecked: {why}"))
                    continue
            if r.status == "verified":
                updates.setdefault(("stale", why), []).append(r.digest)
                changes.append(Change(r.digest, r.rule, shape, "verified", "stale", why))
        if not dry_run and (updates or replacements):
            now = utcnow()
            with self.db.begin() as conn:
                for (status, reason), digests in updates.items():
                    for i in range(0, len(digests), 500):
                        conn.execute(sa.update(K).where(K.c.digest.in_(digests[i:i + 500]))
                                     .values(status=status, stale_reason=reason, updated_at=now))
                done = [n.digest for n in replacements]
                for i in range(0, len(done), 500):
                    conn.execute(sa.delete(K).where(K.c.digest.in_(done[i:i + 500])))
                _insert(conn, K, [_kernel_row(n) for n in replacements])
        return changes

    def gc(self, older_than_days: float = 30.0, *, dry_run: bool = False, now: datetime | None = None) -> GcReport:
        """Delete failed and stale kernel rows not updated for `older_than_days`, and trials older than
        that whose key has no kernel row left. `dry_run` only reports what would go.
        """
        if older_than_days < 0:
            raise RegistryError(f"--older-than {older_than_days:g}: use a number of days >= 0")
        cutoff = ((now or datetime.now(timezone.utc)) - timedelta(days=older_than_days)) \
            .strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        rep = GcReport(dry_run=dry_run)
        with self.db.begin(write=not dry_run) as conn:
            doomed = K.c.status.in_(("failed", "stale")) & (K.c.updated_at < cutoff)
            rep.kernels = [r[0] for r in conn.execute(sa.select(K.c.digest).where(doomed).order_by(K.c.digest))]
            if not dry_run and rep.kernels:
                conn.execute(sa.delete(K).where(doomed))
            # after the delete above, the kept kernels are all there are
            orphan = (TR.c.created_at < cutoff) & TR.c.digest.not_in(sa.select(K.c.digest).where(~doomed))
            rep.trials = conn.execute(sa.select(sa.func.count()).select_from(TR).where(orphan)).scalar()
            if not dry_run and rep.trials:
                conn.execute(sa.delete(TR).where(orphan))
        return rep

    # ----------------------------------------------------------------------------------
    def put_rules(self, recs: Iterable[RuleRecord], *, replace_all: bool = False) -> int:
        """Upsert rule rows by id (replace_all: drop rows not given). Returns how many were written."""
        return self._upsert(RuleRow.__table__, [dataclasses.asdict(r) for r in recs], replace_all)

    def put_examples(self, recs: Iterable[ExampleRecord], *, replace_all: bool = False) -> int:
        """Upsert vetted-example rows by id (replace_all: drop rows not given)."""
        return self._upsert(ExampleRow.__table__, [dataclasses.asdict(r) for r in recs], replace_all)

    def rules(self) -> list[RuleRecord]:
        with self.db.begin(write=False) as conn:
            rows = conn.execute(sa.select(RuleRow.__table__).order_by(RuleRow.__table__.c.id)).all()
        return [RuleRecord(**{f.name: r._mapping[f.name] for f in dataclasses.fields(RuleRecord)}) for r in rows]

    def examples(self) -> list[ExampleRecord]:
        t = ExampleRow.__table__
        with self.db.begin(write=False) as conn:
            rows = conn.execute(sa.select(t).order_by(t.c.id)).all()
        return [ExampleRecord(**{f.name: r._mapping[f.name] for f in dataclasses.fields(ExampleRecord)}) for r in rows]

    def sync_rules(self, ruleset=None) -> int:
        """Mirror the shipped rules (fact_db.discovery.rules.load_rules()) into the rules table."""
        from fact_db.discovery import rules as rules_mod
        rs = ruleset if ruleset is not None else rules_mod.load_rules()
        recs = [RuleRecord(id=r.id, family=r.family, title=r.title, path=str(r.path),
                           hash=hashlib.sha256(Path(r.path).read_bytes()).hexdigest()[:16],
                           template=str(r.realize.get("template", "")), status=str(r.status)) for r in rs]
        return self.put_rules(recs, replace_all=True)

    def _upsert(self, table: sa.Table, rows: list[dict], replace_all: bool) -> int:
        now = utcnow()
        for r in rows:
            r["updated_at"] = now
        with self.db.begin() as conn:
            if replace_all:
                conn.execute(sa.delete(table))
            elif rows:
                ids = [r["id"] for r in rows]
                for i in range(0, len(ids), 500):
                    conn.execute(sa.delete(table).where(table.c.id.in_(ids[i:i + 500])))
            if rows:
                conn.execute(sa.insert(table), rows)
        return len(rows)

    # ----------------------------------------------------------------------------------
    def bulk_insert(self, recs: Iterable[KernelRecord]) -> int:
        """Insert rows whose keys are not in the registry yet, without merging (fixtures, benchmarks)."""
        return self.bulk_insert_rows(_kernel_row(r) for r in recs)

    def bulk_insert_rows(self, rows: Iterable[dict], *, chunk: int = 50000) -> int:
        """Insert rows already in storage form (synthetic_rows' output), unchecked and unmerged.

        DuckDB gets them through a temporary CSV file and one INSERT ... SELECT from
        read_csv (100,000 rows in seconds); other backends through executemany.
        """
        n = 0
        batch: list[dict] = []
        for r in rows:
            batch.append(r)
            if len(batch) >= chunk:
                n += self._insert_rows(batch)
                batch = []
        if batch:
            n += self._insert_rows(batch)
        return n

    def _insert_rows(self, rows: list[dict]) -> int:
        with self.db.begin() as conn:
            _insert(conn, K, rows)
        return len(rows)

    # ----------------------------------------------------------------------------------
    # norm rows (fact_db/kernels/norm/): one per workload key, the winner and its trials
    @staticmethod
    def norm_digest(w, arch: str, gpu: str = "") -> str:
        k = w.key_fields()
        key = (arch, canonical_gpu(gpu) if gpu else "", k["kind"], k["rows"], k["width"], bool(k["residual"]),
               bool(k["write_sum"]), bool(k["has_bias"]), float(k["eps"]), k["dtype"], k["policy"])
        return hashlib.sha256(json.dumps(key).encode()).hexdigest()[:32]

    def norm_get(self, w, arch: str, gpu: str = "") -> dict | None:
        """The stored winner for norm workload `w`: {label, template, config, source_hash, time_ms,
        rel_err, eager_ms} (label "eager" when eager won), or None."""
        with self.db.begin(write=False) as conn:
            row = conn.execute(sa.text("SELECT label, template, config, source_hash, time_ms, rel_err, eager_ms "
                                       "FROM norm_kernels WHERE digest = :d"),
                               {"d": self.norm_digest(w, arch, gpu)}).first()
        if row is None:
            return None
        return {"label": row[0], "template": row[1], "config": json.loads(row[2]) if row[2] else {},
                "source_hash": row[3], "time_ms": row[4], "rel_err": row[5], "eager_ms": row[6]}

    def norm_put(self, w, arch: str, best, trials, gpu: str = "", device_name: str = "",
                 source_hash: str = "") -> None:
        """Store (replace) the winner `best` (a NormTrial) for `w`, with every trial."""
        k = w.key_fields()
        eager = next((t for t in trials if t.label == "eager"), None)
        cfg = dataclasses.asdict(best.candidate) if best.candidate is not None else {}
        row = {"digest": self.norm_digest(w, arch, gpu), "arch": arch, "gpu": canonical_gpu(gpu) if gpu else "",
               "kind": k["kind"], "rows": k["rows"], "width": k["width"], "residual": bool(k["residual"]),
               "write_sum": bool(k["write_sum"]), "has_bias": bool(k["has_bias"]), "eps": float(k["eps"]),
               "dtype": k["dtype"], "policy": k["policy"], "label": best.label,
               "template": "" if best.candidate is None else "add_norm", "config": json.dumps(cfg, sort_keys=True),
               "source_hash": source_hash, "time_ms": best.time_ms, "rel_err": best.err,
               "eager_ms": eager.time_ms if eager else None, "device_name": device_name,
               "trials": json.dumps([{"label": t.label, "status": t.status, "time_ms": t.time_ms, "err": t.err,
                                      "error": t.error} for t in trials]),
               "created_at": utcnow()}
        cols = ", ".join(row)
        vals = ", ".join(f":{c}" for c in row)
        with self.db.begin() as conn:
            conn.execute(sa.text("DELETE FROM norm_kernels WHERE digest = :d"), {"d": row["digest"]})
            conn.execute(sa.text(f"INSERT INTO norm_kernels ({cols}) VALUES ({vals})"), row)


    # region kernels (fact_db/kernels/region/): what the language model wrote for a region no
    # rule covers, stored only after it compiled, verified and beat eager; provenance `llm`
    def region_put(self, spec, arch: str, gpu: str, *, name: str, source: str, build_key: str = "",
                   time_ms: float | None = None, eager_ms: float | None = None, rel_err: float | None = None,
                   eager_rel_err: float | None = None, device_name: str = "", model: str = "",
                   explanation: str = "", provenance: str = "llm", toolchain=None) -> str:
        """Store (replace) the kernel for region `spec` (a RegionSpec); returns the row's digest."""
        from fact_db.core import toolchain as tc_mod
        if provenance not in PROVENANCES:
            raise RegistryError(f"provenance {provenance!r} is not one of {', '.join(PROVENANCES)}")
        if len(source) > MAX_TEXT["source"]:
            raise RegistryError(f"region kernel {name}: source of {len(source)} characters is over "
                                f"{MAX_TEXT['source']}")
        tc = toolchain or tc_mod.current()
        digest = spec.digest(arch, gpu)
        row = {"digest": digest, "arch": arch, "gpu": canonical_gpu(gpu) if gpu else "", "policy": spec.policy,
               "dtype": spec.dtype, "ops": spec.summary(), "region": json.dumps(spec.as_dict(), sort_keys=True),
               "name": name, "source": source, "source_hash": hashlib.sha256(source.encode()).hexdigest(),
               "build_key": build_key, "nvcc_version": nvcc_now(tc), "cutlass_version": tc.cutlass or "",
               "time_ms": time_ms, "eager_ms": eager_ms, "rel_err": rel_err, "eager_rel_err": eager_rel_err,
               "device_name": device_name, "provenance": provenance, "status": "verified", "model": model,
               "explanation": explanation[:4096], "created_at": utcnow()}
        cols = ", ".join(row)
        vals = ", ".join(f":{c}" for c in row)
        with self.db.begin() as conn:
            conn.execute(sa.text("DELETE FROM region_kernels WHERE digest = :d"), {"d": digest})
            conn.execute(sa.text(f"INSERT INTO region_kernels ({cols}) VALUES ({vals})"), row)
        return digest

    _REGION_COLS = ("digest", "arch", "gpu", "policy", "dtype", "ops", "region", "name", "source", "source_hash",
                    "build_key", "nvcc_version", "cutlass_version", "time_ms", "eager_ms", "rel_err",
                    "eager_rel_err", "device_name", "provenance", "status", "model", "explanation", "created_at")

    def region_get(self, spec, arch: str, gpu: str) -> dict | None:
        """The stored kernel for region `spec` on this arch and GPU (a dict of the row), or None."""
        with self.db.begin(write=False) as conn:
            row = conn.execute(sa.text(f"SELECT {', '.join(self._REGION_COLS)} FROM region_kernels WHERE digest = :d"),
                               {"d": spec.digest(arch, gpu)}).first()
        return dict(zip(self._REGION_COLS, row)) if row is not None else None

    def region_kernels(self) -> list[dict]:
        """Every stored region kernel, newest first."""
        with self.db.begin(write=False) as conn:
            rows = conn.execute(sa.text(f"SELECT {', '.join(self._REGION_COLS)} FROM region_kernels "
                                        "ORDER BY created_at DESC")).all()
        return [dict(zip(self._REGION_COLS, r)) for r in rows]


@dataclass
class MergeResult:
    """What put_kernels did: counts, and each row's outcome in order."""
    inserted: int = 0
    replaced: int = 0
    kept: int = 0
    outcomes: list[str] = field(default_factory=list)


def _nearest(conn: sa.Connection, key: KernelKey, cur: Current, max_distance: float | None,
             first: int = 8) -> tuple[KernelRecord, float] | None:
    """The exact row, else the nearest compatible one (usable before stale), with its distance.

    The family column is a digest of the key's non-shape fields and divisibility classes,
    so one equality finds every candidate (the exact row is among them, at distance 0).
    A cold DuckDB file costs per column fetched from scattered rows, and `rowid IN (...)`
    scans the table while `rowid = x` does not: so the scan takes only the shapes, full
    rows are fetched one by one, nearest first, until a usable one (or the exact one) is
    found, and only when the first few are all stale are the rest ranked in one query.
    """
    handle = sa.literal_column("rowid") if conn.dialect.name in ("duckdb", "sqlite") else K.c.digest
    family = [K.c.family == key.family(), K.c.status != "failed"]
    rows = conn.execute(sa.select(handle.label("h"), K.c.m, K.c.n, K.c.k, K.c.batch).where(*family)).all()
    cands = []
    for r in rows:
        d = (abs(math.log2(r.m / key.m)) + abs(math.log2(r.n / key.n)) + abs(math.log2(r.k / key.k))
             + abs(math.log2(r.batch / key.batch)))
        if max_distance is None or d <= max_distance:
            cands.append((d, r.h))
    cands.sort()
    best = None

    def consider(row):
        nonlocal best
        rec = _kernel_record(row)
        if rec.key.with_(m=key.m, n=key.n, k=key.k, batch=key.batch) != key:
            return  # a family-digest collision: never seen, but checked
        d = rec.key.distance(key)
        rank = (d != 0.0, bool(cur.staleness(rec)), d, rec.time_ms if rec.time_ms is not None else math.inf,
                rec.digest)
        if best is None or rank < best[0]:
            best = (rank, rec, d)

    i = 0
    while i < len(cands):
        j = i
        while j < len(cands) and cands[j][0] == cands[i][0]:
            j += 1
        if j > first:
            break
        for _, h in cands[i:j]:          # one distance at a time (ties are ranked by speed)
            consider(conn.execute(sa.select(K).where(handle == h)).first())
        i = j
        if best is not None and (not best[0][0] or not best[0][1]):
            return best[1], best[2]      # the exact row, or a usable one: nothing further can beat it
    if i < len(cands):   # the rest, ranked from their toolchain columns; then the winner's full row
        dist = {h: d for d, h in cands[i:]}
        top = None
        for r in conn.execute(sa.select(handle.label("h"), K.c.digest, K.c.status, K.c.time_ms, K.c.template,
                                        K.c.template_hash, K.c.cutlass_version, K.c.nvcc_version).where(*family)):
            if r.h in dist:
                stale = r.status == "stale" or bool(cur.mismatch(r.template, r.template_hash, r.cutlass_version,
                                                                 r.nvcc_version))
                rank = (True, stale, dist[r.h], r.time_ms if r.time_ms is not None else math.inf, r.digest)
                if top is None or rank < top[0]:
                    top = (rank, r.h)
        if top is not None and (best is None or top[0] < best[0]):
            consider(conn.execute(sa.select(K).where(handle == top[1])).first())
    return (best[1], best[2]) if best else None


def _merge_into(conn: sa.Connection, recs: list[KernelRecord], cur: Current) -> MergeResult:
    """Merge `recs` into the kernels table on an open transaction (later rows see earlier ones)."""
    res = MergeResult()
    now = utcnow()
    digests = sorted({r.digest for r in recs})
    existing: dict[str, KernelRecord] = {}
    for i in range(0, len(digests), 500):
        for row in conn.execute(sa.select(K).where(K.c.digest.in_(digests[i:i + 500]))):
            rec = _kernel_record(row)
            existing[rec.digest] = rec
    stored = set(existing)
    final: dict[str, KernelRecord] = {}
    for rec in recs:
        old = final.get(rec.digest, existing.get(rec.digest))
        outcome = merge_decision(old, rec, cur)
        res.outcomes.append(outcome)
        setattr(res, outcome, getattr(res, outcome) + 1)
        if outcome != "kept":
            final[rec.digest] = rec.replace(updated_at=now)
    replaced = sorted(d for d in final if d in stored)
    for i in range(0, len(replaced), 500):
        conn.execute(sa.delete(K).where(K.c.digest.in_(replaced[i:i + 500])))
    _insert(conn, K, [_kernel_row(r) for r in final.values()])
    return res


_CSV_NULL = r"\N"


def _insert(conn: sa.Connection, table: sa.Table, rows: list[dict]) -> None:
    """INSERT many rows. DuckDB's executemany costs milliseconds a row, so more than a few go
    through a temporary CSV file and one INSERT ... SELECT from read_csv."""
    if not rows:
        return
    if conn.dialect.name != "duckdb" or len(rows) <= 8 or any(v == _CSV_NULL for r in rows for v in r.values()):
        conn.execute(sa.insert(table), rows)
        return
    import csv
    import tempfile
    cols = [c.name for c in table.columns]
    with tempfile.NamedTemporaryFile("w", suffix=".csv", newline="", encoding="utf-8", delete=False) as f:
        w = csv.writer(f)
        w.writerow(cols)
        for r in rows:
            w.writerow([_CSV_NULL if r[c] is None else r[c] for c in cols])
    try:
        src = f.name.replace("'", "''")
        types = ", ".join(f"'{c}': 'VARCHAR'" for c in cols)
        conn.exec_driver_sql(f"insert into {table.name} ({', '.join(cols)}) select {', '.join(cols)} from "
                             f"read_csv('{src}', header = true, quote = '\"', escape = '\"', nullstr = '\\N', "
                             f"columns = {{{types}}})")
    finally:
        os.unlink(f.name)


# Limits on imported rows (README, "Limits on untrusted input"): what the columns hold, and
# no more, so one hostile line cannot make every later `registry list` read gigabytes.
MAX_IMPORT_LINE = 1024 * 1024       # characters in one JSONL line
MAX_TEXT = {"notes": 4096, "source": 512 * 1024}
MAX_TEXT_DEFAULT = 16 * 1024        # any other string field (config, names, keys)
INT64 = (-(2 ** 63), 2 ** 63 - 1)   # BIGINT columns


def _lines(f: IO[str]):
    """(number, line or None if it was longer than MAX_IMPORT_LINE) without ever holding more
    than MAX_IMPORT_LINE characters of one line."""
    n = 0
    while True:
        line = f.readline(MAX_IMPORT_LINE + 1)
        if not line:
            return
        n += 1
        if len(line) > MAX_IMPORT_LINE and not line.endswith("\n"):
            while True:  # skip the rest of the over-long line in bounded pieces
                rest = f.readline(MAX_IMPORT_LINE)
                if not rest or rest.endswith("\n"):
                    break
            yield n, None
        else:
            yield n, line


def _field_faults(d, path: str = "") -> list[str]:
    """Strings longer than their column allows and integers beyond 64 bits, by field."""
    out, stack = [], [(path, d)]
    while stack and len(out) < 5:
        where, v = stack.pop()
        if isinstance(v, dict):
            stack.extend((f"{where}.{k}" if where else str(k), x) for k, x in v.items())
        elif isinstance(v, list):
            stack.extend((f"{where}[{i}]", x) for i, x in enumerate(v))
        elif isinstance(v, str):
            limit = MAX_TEXT.get(where, MAX_TEXT_DEFAULT)
            if len(v) > limit:
                out.append(f"field `{where}` is {len(v)} characters, over its limit of {limit}")
        elif isinstance(v, int) and not isinstance(v, bool) and not INT64[0] <= v <= INT64[1]:
            out.append(f"field `{where}` is {str(v)[:20]}..., beyond the 64-bit integers the registry holds")
    return out


def _parse_jsonl(f: IO[str], name: str, provenance: str) -> list[KernelRecord]:
    """Every line checked; raises ImportError_ listing all bad lines, so nothing is half-applied."""
    records, problems = [], []
    for n, line in _lines(f):
        if line is None:
            problems.append((n, f"the line is longer than {MAX_IMPORT_LINE} characters"))
            continue
        if not line.strip():
            continue
        try:
            d = json.loads(line, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(f"{c} is not allowed")))
        except (ValueError, RecursionError) as e:
            problems.append((n, f"not valid JSON ({e})" if isinstance(e, ValueError) else "nested too deep"))
            continue
        faults = _field_faults(d)
        if faults:
            problems.append((n, "; ".join(faults)))
            continue
        try:
            if isinstance(d, dict) and not d.get("provenance"):
                d = {**d, "provenance": provenance}
            records.append(KernelRecord.from_dict(d))
        except RegistryError as e:
            problems.append((n, str(e)))
        except TypeError as e:
            problems.append((n, f"bad field ({e})"))
    if problems:
        raise ImportError_(name, problems)
    return records


# --------------------------------------------------------------------------------------

def synthetic_rows(n: int, *, seed: int = 0, gpus=("h100", "h200", "a100"), rules=None) -> Iterator[dict]:
    """`n` distinct, plausible, verified kernel rows in storage form (fast: no validation), for
    benchmarks and tests; deterministic per seed. Feed them to Registry.bulk_insert_rows.

    Keys spread over rules, GPUs, policies, epilogues, layouts and multiple-of-64 shapes
    (plus a few off by 8 or 16), so a nearest-shape search has dozens of same-family
    candidates to rank.
    """
    import random as _random
    rnd = _random.Random(seed)
    rules = rules or ("gemm", "gemm-bias", "gemm-bias-relu", "gemm-bias-gelu-tanh", "gemm-residual", "batched-gemm")
    epi = {"gemm": "none", "gemm-bias": "bias", "gemm-bias-relu": "bias_relu", "gemm-bias-gelu-tanh": "bias_gelu_tanh",
           "gemm-residual": "residual", "batched-gemm": "none"}
    pol_dtype = {"fp32": "float32", "tf32": "float32", "tf32x3": "float32", "bf16": "bfloat16", "fp16": "float16"}
    sizes = [64 * i for i in range(1, 129)] + [s - 8 for s in (1024, 2048, 4096)] + [s + 16 for s in (1024, 2048)]
    policies = tuple(pol_dtype)
    seen: set[str] = set()
    made = 0
    created = datetime(2026, 1, 1, tzinfo=timezone.utc)
    while made < n:
        rule = rnd.choice(rules)
        policy = rnd.choice(policies)
        dt = pol_dtype[policy]
        gpu = rnd.choice(gpus)
        key = {"rule": rule, "arch": "sm80" if gpu == "a100" else "sm90a", "gpu": gpu, "dtype_in": dt,
               "dtype_acc": "float32", "dtype_out": dt, "layout_a": "row", "layout_b": rnd.choice(("row", "col")),
               "m": rnd.choice(sizes), "n": rnd.choice(sizes), "k": rnd.choice(sizes),
               "batch": rnd.choice((2, 4, 8, 16)) if rule == "batched-gemm" else 1,
               "epilogue": epi[rule], "policy": policy}
        digest = hashlib.sha256(json.dumps([key[f] for f in KernelKey.FIELDS], separators=(",", ":")).encode()) \
            .hexdigest()[:16]
        if digest in seen:
            continue
        seen.add(digest)
        made += 1
        divs = [_div_class(key[f]) for f in ("m", "n", "k")]
        family = hashlib.sha256(json.dumps([key[f] for f in _NON_SHAPE] + divs, separators=(",", ":")).encode()) \
            .hexdigest()[:16]
        t = round(2 * key["m"] * key["n"] * key["k"] * key["batch"] / 4e11 * 1e3 * rnd.uniform(0.8, 1.5), 6)
        config = {"tile_m": rnd.choice((64, 128, 256)), "tile_n": rnd.choice((64, 128, 256)),
                  "tile_k": rnd.choice((32, 64)), "stages": rnd.choice((3, 4, 5))}
        when = (created + timedelta(seconds=made)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        yield {"digest": digest, **key, "m_div": divs[0], "n_div": divs[1], "k_div": divs[2], "family": family,
               "template": "gemm_sm80" if gpu == "a100" else "gemm_sm90",
               "config": json.dumps(config, sort_keys=True, separators=(",", ":")), "source_hash": f"{made:016x}",
               "template_hash": "synthetic", "cutlass_version": "4.2.0.0", "nvcc_version": "13.0.88",
               "factdb_version": "0.1.0", "time_ms": t, "baseline": "torch eager",
               "baseline_ms": round(t * rnd.uniform(1.0, 1.6), 6), "rel_err": 1e-6, "baseline_rel_err": 1e-6,
               "device_name": f"NVIDIA {gpu.upper()}", "provenance": "rule", "status": "verified",
               "stale_reason": "", "error": "", "created_at": when, "updated_at": when, "notes": "synthetic"}


def synthetic_records(n: int, *, seed: int = 0, **kw) -> Iterator[KernelRecord]:
    """synthetic_rows as validated KernelRecords (slower; for tests)."""
    return (_kernel_record(r) for r in synthetic_rows(n, seed=seed, **kw))
