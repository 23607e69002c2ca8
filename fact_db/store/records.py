"""Registry records: a tuned winner (KernelRecord), a tried candidate (TrialRecord), a lookup's
answer (Lookup), and the rules that judge them: staleness (Current) and merge (merge_decision).

    >>> rec = KernelRecord(key=key, template="gemm_sm90", config={"tile_m": 128}, time_ms=1.9,
    ...                    baseline="torch eager", baseline_ms=2.4).stamped()   # env, template hash, version
    >>> rec.env.gpu_sku, rec.device_name                                        # the full SKU
    ('NVIDIA H100 80GB HBM3', 'NVIDIA H100 80GB HBM3')
    >>> Current().staleness(rec.replace(env=rec.env.with_(torch="2.9.0")))
    'torch 2.9.0 then, 2.11.0+cu130 now'

Staleness. A row is not usable here when its environment differs from this one
(Environment.mismatch: GPU SKU, driver, CUDA runtime, torch, cuBLAS, cuDNN, CUTLASS, nvcc;
without a GPU here only CUTLASS and nvcc are compared, the rest being the target's), when
its template's hash differs from the template file's now (rows with no template file,
"eager", "library" and the agent's "llm_region", skip this), or when it is marked stale. A
stale row whose environment matches again is restored by `factdb registry revalidate`,
except a row carried over from registry schema 4, whose environment was never recorded:
only tuning the workload again replaces it. fact-db's own version does not count.

Merge (Registry.put, imports, the seed), per key. Rows rank: verified and current here >
verified or stale elsewhere > failed. A higher rank replaces a lower one; a verified row is
never replaced by an unverified one. Within a rank: two rows measured in the same environment
with the same template hash -> the faster wins (a tie keeps the old row); in different
environments -> the newer `created_at` wins.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone

from fact_db.core.environment import FIELDS as ENV_FIELDS
from fact_db.core.environment import Environment
from fact_db.store.errors import RegistryError
from fact_db.store.keys import SLUG, Key

KERNEL_STATUSES = ("verified", "stale", "failed")
TRIAL_STATUSES = ("ok", "compile_error", "verify_failed", "launch_error", "timeout", "crashed", "skipped",
                  "build_failed")
TRIAL_FAILURES = frozenset(TRIAL_STATUSES) - {"ok", "skipped"}
PROVENANCES = ("rule", "llm", "seed", "import")
# Winners that no template file renders: the library (an SDPA backend, cuBLAS), eager PyTorch,
# and the agent's region kernels (their source is in the row itself).
NOT_TEMPLATES = ("", "eager", "library", "llm_region")
# The stale reason of a row whose environment was never recorded (schema 4 had no environment
# key); fact_db.store.migrations writes it, and jsonl for old exports.
CARRIED_OVER = "carried over from registry schema 4"
MAX_SOURCE = 512 * 1024   # characters of a kernel source kept in a row


def utcnow() -> str:
    """Now, UTC, ISO 8601 with microseconds and a Z: sorts as text."""
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def norm_time(value) -> str:
    """An ISO 8601 time as utcnow() writes it (now when empty)."""
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


def _config(config) -> dict:
    if not isinstance(config, dict):
        raise RegistryError(f"config must be a JSON object, got {config!r}")
    try:
        json.dumps(config, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise RegistryError(f"config is not plain JSON ({e})") from None
    return config


def _check_key_and_env(rec) -> None:
    if not isinstance(rec.key, Key) or not rec.key.FAMILY:
        raise RegistryError(f"key must be a family's key (GemmKey, AttentionKey, ...), got {type(rec.key).__name__}")
    if not isinstance(rec.env, Environment):
        raise RegistryError(f"env must be an Environment (fact_db.core.environment), got {type(rec.env).__name__}")


def _flat(rec) -> dict:
    """digest, family, the key's fields, then the record's own fields with the environment's inline."""
    d = {"digest": rec.digest, "family": rec.key.FAMILY, **rec.key.as_dict()}
    for f in dataclasses.fields(rec):
        if f.name == "env":
            d.update(rec.env.as_dict())
        elif f.name != "key":
            d[f.name] = getattr(rec, f.name)
    return d


def template_hash_now(template: str) -> str:
    """The hash of `template`'s file(s) now; "" for winners that no template renders."""
    if template in NOT_TEMPLATES:
        return ""
    from fact_db.core import toolchain
    return toolchain.template_hash(template)


def _stamp(template: str, env: Environment | None, template_hash: str | None) -> dict:
    from fact_db import __version__
    from fact_db.core import environment
    return {"env": env if env is not None else environment.current(), "factdb_version": __version__,
            "template_hash": template_hash if template_hash is not None else template_hash_now(template)}


@dataclass(frozen=True)
class KernelRecord:
    """A tuned winner for one key, and the environment it was measured in.

    `time_ms` is the median; `rel_err` the error vs the float64 reference, `baseline_*` the
    same for the baseline (the library or eager PyTorch) measured in the same run. `template`
    is a kernels_cpp template, or "eager"/"library" where those won, or "llm_region"; `label`
    names the winner within its template (an SDPA backend, a config's label); `source` holds
    the kernel source where no template renders it again (the agent's region kernels).
    """

    key: Key
    template: str
    config: dict = field(default_factory=dict)
    label: str = ""
    time_ms: float | None = None
    baseline: str = ""
    baseline_ms: float | None = None
    rel_err: float | None = None
    baseline_rel_err: float | None = None
    status: str = "verified"
    provenance: str = "rule"
    source_hash: str = ""
    template_hash: str = ""
    source: str = ""
    env: Environment = field(default_factory=Environment)
    factdb_version: str = ""
    error: str = ""
    stale_reason: str = ""
    notes: str = ""
    created_at: str = ""
    updated_at: str = ""

    def __post_init__(self):
        _check_key_and_env(self)
        if not isinstance(self.template, str) or (self.template and not SLUG.fullmatch(self.template)):
            raise RegistryError(f"template {self.template!r} is not a template name such as gemm_sm90 (or eager, "
                                "library)")
        _config(self.config)
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
        for name in ("label", "baseline", "source_hash", "template_hash", "source", "factdb_version", "error",
                     "stale_reason", "notes"):
            object.__setattr__(self, name, _text(name, getattr(self, name)))
        if len(self.source) > MAX_SOURCE:
            raise RegistryError(f"source of {len(self.source)} characters is over the {MAX_SOURCE} a row keeps")
        object.__setattr__(self, "created_at", norm_time(self.created_at))
        object.__setattr__(self, "updated_at", norm_time(self.updated_at or self.created_at))

    @property
    def digest(self) -> str:
        return self.key.digest()

    @property
    def family(self) -> str:
        return self.key.FAMILY

    @property
    def device_name(self) -> str:
        """The full GPU name it was measured on (env.gpu_sku)."""
        return self.env.gpu_sku

    @property
    def speedup(self) -> float | None:
        return self.baseline_ms / self.time_ms if self.time_ms and self.baseline_ms else None

    def env_key(self) -> tuple:
        """What "measured in the same environment" compares: the environment and the template hash."""
        return self.env, self.template_hash

    def stamped(self, env: Environment | None = None, template_hash: str | None = None) -> KernelRecord:
        """A copy with `env` (default: this process's, fact_db.core.environment.current()), the
        template's hash now (unless given) and fact-db's version."""
        return dataclasses.replace(self, **_stamp(self.template, env, template_hash))

    def replace(self, **changes) -> KernelRecord:
        return dataclasses.replace(self, **changes)

    def as_dict(self) -> dict:
        """Flat, the JSONL form: digest, family, the key fields, the record fields, the environment
        fields under their own names (gpu_sku, driver, cuda, torch, cublas, cudnn, cutlass, nvcc)."""
        return _flat(self)

    @classmethod
    def from_dict(cls, d: dict) -> KernelRecord:
        """The inverse of as_dict; checks every field, and the digest when present."""
        if not isinstance(d, dict):
            raise RegistryError(f"a kernel row must be a JSON object, got {type(d).__name__}")
        if "family" not in d:
            raise RegistryError("field family is missing (gemm, attention, norm or region)")
        kc = Key.family_class(d["family"])
        own = {f.name for f in dataclasses.fields(cls)} - {"key", "env"}
        unknown = sorted(set(d) - set(kc.FIELDS) - own - set(ENV_FIELDS) - {"digest", "family"})
        if unknown:
            raise RegistryError(f"unknown fields {', '.join(unknown)} (a newer fact-db's export, or a typo)")
        if "template" not in d:
            raise RegistryError("field template is missing")
        for f in ENV_FIELDS:
            _text(f, d.get(f))
        key = Key.from_dict(d["family"], d)
        env = Environment.from_dict({f: d[f] for f in ENV_FIELDS if f in d})
        rec = cls(key=key, env=env, **{k: v for k, v in d.items() if k in own})
        if "digest" in d and d["digest"] != rec.digest:
            raise RegistryError(f"digest {d['digest']!r} does not match the key fields (they give {rec.digest!r}); "
                                "drop the digest field or fix the key")
        return rec


@dataclass(frozen=True)
class TrialRecord:
    """One candidate tried for a key, whatever became of it (status), in one environment."""

    key: Key
    template: str
    config: dict
    status: str
    time_ms: float | None = None
    rel_err: float | None = None
    error: str = ""          # the first error line, or the nvcc command that failed
    config_hash: str = ""    # computed from config when empty
    template_hash: str = ""
    env: Environment = field(default_factory=Environment)
    factdb_version: str = ""
    created_at: str = ""
    id: str = ""

    def __post_init__(self):
        _check_key_and_env(self)
        if self.status not in TRIAL_STATUSES:
            raise RegistryError(f"trial status {self.status!r} is not one of {', '.join(TRIAL_STATUSES)}")
        _config(self.config)
        object.__setattr__(self, "template", _text("template", self.template))
        object.__setattr__(self, "time_ms", _num("time_ms", self.time_ms))
        object.__setattr__(self, "rel_err", _num("rel_err", self.rel_err))
        object.__setattr__(self, "error", _text("error", self.error))
        object.__setattr__(self, "config_hash", self.config_hash or config_hash(self.config))
        object.__setattr__(self, "created_at", norm_time(self.created_at))
        object.__setattr__(self, "id", self.id or uuid.uuid4().hex)

    @property
    def digest(self) -> str:
        return self.key.digest()

    def stamped(self, env: Environment | None = None, template_hash: str | None = None) -> TrialRecord:
        return dataclasses.replace(self, **_stamp(self.template, env, template_hash))

    def as_dict(self) -> dict:
        return _flat(self)


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
        return f"{kind} {self.record.digest} {self.record.key.summary}" + (f" STALE: {self.stale_reason}"
                                                                            if self.stale else "")


def carried_over(rec) -> bool:
    """A row whose environment schema 4 never recorded (marked stale by the migration or an old import)."""
    return rec.status == "stale" and rec.stale_reason.startswith(CARRIED_OVER)


class Current:
    """What rows are judged against: an environment (default: this process's) and the template
    hashes now (computed once each, unless given: tests pass them)."""

    def __init__(self, env: Environment | None = None, template_hashes: dict[str, str] | None = None):
        from fact_db.core import environment
        if env is not None and not isinstance(env, Environment):
            raise RegistryError(f"env must be an Environment (fact_db.core.environment), got {type(env).__name__}")
        self.env = env if env is not None else environment.current()
        self._hashes = dict(template_hashes or {})

    def template_hash(self, name: str) -> str:
        if name not in self._hashes:
            self._hashes[name] = template_hash_now(name)
        return self._hashes[name]

    def mismatch(self, template: str, template_hash: str, env: Environment) -> str:
        """Why a row with this template, template hash and environment is stale here, or ""."""
        why = [w for w in (self.env.mismatch(env),) if w]
        if template not in NOT_TEMPLATES:
            now = self.template_hash(template)
            if template_hash != now:
                why.append(f"template {template} no longer exists" if not now else
                           f"template {template} changed (hash {template_hash or '(none)'}, now {now})")
        return "; ".join(why)

    def staleness(self, rec) -> str:
        """Why `rec` (a KernelRecord, or anything with its template, template_hash, env, status and
        stale_reason) is not usable here, or "" when it is."""
        live = self.mismatch(rec.template, rec.template_hash, rec.env)
        if rec.status != "stale" or live:
            return live
        if carried_over(rec):
            return f"{rec.stale_reason}; tune it again to replace it"
        return (f"marked stale ({rec.stale_reason or 'no reason recorded'}); its environment and template match "
                "now, so `factdb registry revalidate` will restore it")


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
    if rn > 0 and old.env_key() == new.env_key():
        faster = new.time_ms is not None and (old.time_ms is None or new.time_ms < old.time_ms)
        return "replaced" if faster else "kept"
    return "replaced" if new.created_at > old.created_at else "kept"


# --------------------------------------------------------------------------------------
# what the registry's methods return

@dataclass
class MergeResult:
    """What Registry.put_many did: counts, and each row's outcome in order."""
    inserted: int = 0
    replaced: int = 0
    kept: int = 0
    outcomes: list[str] = field(default_factory=list)


@dataclass
class ImportReport:
    """What an import did. `carried`: rows in the schema-4 format (no `family`), imported as stale
    because their environment was not recorded (see CARRIED_OVER)."""
    inserted: int = 0
    replaced: int = 0
    kept: int = 0
    path: str = ""
    carried: int = 0

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


def _no_clashes() -> None:
    """A key field named like a record or environment field would be ambiguous in the flat JSONL form."""
    own = {f.name for f in dataclasses.fields(KernelRecord)} | set(ENV_FIELDS) | {"digest", "family"}
    for fam, kc in Key.families().items():
        clash = own & set(kc.FIELDS)
        assert not clash, f"key fields of family {fam} clash with record fields: {sorted(clash)}"


_no_clashes()
