"""Numbered schema migrations of the registry database (fact_db.store.db runs them).

Each is a function of a connection, run once, in order, in the transaction that opens a
database of an older schema; each builds its own frozen table definitions (and, for m005,
its own copy of the key digest scheme of schema 5), so later changes to the models in
fact_db.store.tables or the keys in fact_db.store.keys cannot alter what it does.

    1  m001_initial         kernels and trials (GEMM), rules, examples, factdb_meta
    2  m002_attention       attention_kernels
    3  m003_norms           norm_kernels
    4  m004_region_kernels  region_kernels (the agent's kernels)
    5  m005_families        one kernels and one trials table for every family, keyed by
                            (family, key fields) with the environment key; every row carried over
    6  m006_team            leases (a workload being tuned, claimed by one host until it expires)
                            and outbox (rows the team registry's cache holds for a server that
                            was unreachable); every backend gets both, used where they apply
    7  m007_binaries        kernel_binaries (built kernels a team registry shares by build key,
                            where its hosts opt in)

m005 carries every row of schema 4 over: GEMM rows re-digested under the one scheme, the
attention, norm and region rows keyed from their columns, their trials JSON made trial rows.
Schema 4 recorded no driver, CUDA runtime, torch, cuBLAS or cuDNN, so a carried-over verified
(or stale) row becomes stale, its reason naming the unknown fields ("carried over from registry
schema 4: driver, CUDA runtime, torch, cuBLAS, cuDNN not recorded"); `revalidate` never restores
such a row (its environment can never be shown to match), and tuning the workload again
replaces it. Failed rows stay failed. The old tables are dropped.
"""
from __future__ import annotations

import hashlib
import json
import math
import time

import sqlalchemy as sa

from fact_db.store.bulk import insert_rows
from fact_db.store.rows import SCHEMA_VERSION  # the newest schema this fact-db writes; see MIGRATIONS


def _m001_initial(conn: sa.Connection) -> None:
    # DuckDB rewrites a changed ART index whole at every checkpoint, and a connection
    # checkpoints when it closes: with a primary key on 100,000 kernel rows one small write
    # took 450 ms instead of 56 ms (measured). So on DuckDB the two big tables have no
    # index or key constraint (its zone maps and column scans serve the lookups, and
    # fact_db.store.registry keeps digests unique under the write lock); other backends get them.
    indexed = conn.dialect.name != "duckdb"
    md = sa.MetaData()
    S, T, I, D = sa.String, sa.Text, sa.BigInteger, sa.Double
    key_cols = lambda: [
        sa.Column("rule", S, nullable=False), sa.Column("arch", S, nullable=False),
        sa.Column("gpu", S, nullable=False), sa.Column("dtype_in", S, nullable=False),
        sa.Column("dtype_acc", S, nullable=False), sa.Column("dtype_out", S, nullable=False),
        sa.Column("layout_a", S, nullable=False), sa.Column("layout_b", S, nullable=False),
        sa.Column("m", I, nullable=False), sa.Column("n", I, nullable=False),
        sa.Column("k", I, nullable=False), sa.Column("batch", I, nullable=False),
        sa.Column("epilogue", S, nullable=False), sa.Column("policy", S, nullable=False)]
    tool_cols = lambda: [
        sa.Column("template_hash", S, nullable=False), sa.Column("cutlass_version", S, nullable=False),
        sa.Column("nvcc_version", S, nullable=False), sa.Column("factdb_version", S, nullable=False)]
    sa.Table("factdb_meta", md, sa.Column("key", S, primary_key=True), sa.Column("value", T, nullable=False))
    sa.Table(
        "kernels", md, sa.Column("digest", S, primary_key=indexed, nullable=False), *key_cols(),
        sa.Column("m_div", sa.Integer, nullable=False), sa.Column("n_div", sa.Integer, nullable=False),
        sa.Column("k_div", sa.Integer, nullable=False), sa.Column("family", S, nullable=False),
        sa.Column("template", S, nullable=False), sa.Column("config", T, nullable=False),
        sa.Column("source_hash", S, nullable=False), *tool_cols(),
        sa.Column("time_ms", D), sa.Column("baseline", S, nullable=False), sa.Column("baseline_ms", D),
        sa.Column("rel_err", D), sa.Column("baseline_rel_err", D), sa.Column("device_name", S, nullable=False),
        sa.Column("provenance", S, nullable=False), sa.Column("status", S, nullable=False),
        sa.Column("stale_reason", T, nullable=False), sa.Column("error", T, nullable=False),
        sa.Column("created_at", S, nullable=False), sa.Column("updated_at", S, nullable=False),
        sa.Column("notes", T, nullable=False),
        # family: a digest of the non-shape key fields and M/N/K divisibility classes, so the
        # nearest-shape search is one equality on one column
        *([sa.Index("ix_kernels_family", "family")] if indexed else []),
    )
    sa.Table(
        "trials", md, sa.Column("id", S, primary_key=indexed, nullable=False), sa.Column("digest", S, nullable=False),
        *key_cols(),
        sa.Column("template", S, nullable=False), sa.Column("config", T, nullable=False),
        sa.Column("config_hash", S, nullable=False), sa.Column("status", S, nullable=False),
        sa.Column("time_ms", D), sa.Column("rel_err", D), sa.Column("error", T, nullable=False), *tool_cols(),
        sa.Column("device_name", S, nullable=False), sa.Column("created_at", S, nullable=False),
        *([sa.Index("ix_trials_digest", "digest", "config_hash")] if indexed else []),
    )
    sa.Table("rules", md, sa.Column("id", S, primary_key=True), sa.Column("family", S, nullable=False),
             sa.Column("title", T, nullable=False), sa.Column("path", T, nullable=False),
             sa.Column("hash", S, nullable=False), sa.Column("template", S, nullable=False),
             sa.Column("status", S, nullable=False), sa.Column("updated_at", S, nullable=False))
    sa.Table("examples", md, sa.Column("id", S, primary_key=True), sa.Column("kind", S, nullable=False),
             sa.Column("title", T, nullable=False), sa.Column("source_path", T, nullable=False),
             sa.Column("hash", S, nullable=False), sa.Column("arch", S, nullable=False),
             sa.Column("notes", T, nullable=False), sa.Column("updated_at", S, nullable=False))
    md.create_all(conn, checkfirst=False)


def _m002_attention(conn: sa.Connection) -> None:
    # one row per tuned attention workload: its key (batch, heads, KV heads, lengths, head
    # dims, causal, scale, dtype, policy, arch, gpu) and the winner (an SDPA backend, the
    # explicit form, or a family kernel with its config), with every trial as JSON
    md = sa.MetaData()
    S, T, I, D = sa.String, sa.Text, sa.BigInteger, sa.Double
    sa.Table(
        "attention_kernels", md, sa.Column("digest", S, primary_key=True),
        sa.Column("arch", S, nullable=False), sa.Column("gpu", S, nullable=False),
        sa.Column("batch", I, nullable=False), sa.Column("heads", I, nullable=False),
        sa.Column("kv_heads", I, nullable=False), sa.Column("lq", I, nullable=False),
        sa.Column("lk", I, nullable=False), sa.Column("d", I, nullable=False), sa.Column("dv", I, nullable=False),
        sa.Column("causal", sa.Boolean, nullable=False), sa.Column("scale", D, nullable=False),
        sa.Column("dtype", S, nullable=False), sa.Column("policy", S, nullable=False),
        sa.Column("label", S, nullable=False), sa.Column("kind", S, nullable=False),
        sa.Column("template", S, nullable=False), sa.Column("config", T, nullable=False),
        sa.Column("time_ms", D), sa.Column("rel_err", D), sa.Column("device_name", S, nullable=False),
        sa.Column("trials", T, nullable=False), sa.Column("created_at", S, nullable=False),
    )
    md.create_all(conn, checkfirst=True)


def _m003_norms(conn: sa.Connection) -> None:
    # Tuned norm kernels (fact_db/kernels/norm/norm.py): one row per workload key (kind, rows, width,
    # residual, write_sum, bias, eps, dtype, policy) on one arch and GPU: the winner (a
    # template build or eager) with every trial. Numbered 3: migration 2 is attention's.
    md = sa.MetaData()
    S, T, I, D = sa.String, sa.Text, sa.BigInteger, sa.Double
    sa.Table(
        "norm_kernels", md, sa.Column("digest", S, primary_key=True),
        sa.Column("arch", S, nullable=False), sa.Column("gpu", S, nullable=False),
        sa.Column("kind", S, nullable=False), sa.Column("rows", I, nullable=False),
        sa.Column("width", I, nullable=False), sa.Column("residual", sa.Boolean, nullable=False),
        sa.Column("write_sum", sa.Boolean, nullable=False), sa.Column("has_bias", sa.Boolean, nullable=False),
        sa.Column("eps", D, nullable=False), sa.Column("dtype", S, nullable=False), sa.Column("policy", S, nullable=False),
        sa.Column("label", S, nullable=False), sa.Column("template", S, nullable=False),
        sa.Column("config", T, nullable=False), sa.Column("source_hash", S, nullable=False),
        sa.Column("time_ms", D), sa.Column("rel_err", D), sa.Column("eager_ms", D),
        sa.Column("device_name", S, nullable=False), sa.Column("trials", T, nullable=False),
        sa.Column("created_at", S, nullable=False),
    )
    md.create_all(conn, checkfirst=True)


def _m004_region_kernels(conn: sa.Connection) -> None:
    # Kernels the language model wrote for a region no rule covers (fact_db/kernels/region/region_kernel.py),
    # accepted only after they compiled, verified against float64 and beat eager: one row per
    # region key (its ops, constants and input shapes, dtype, policy, arch, GPU), with the
    # source itself (the only copy: no template renders it again) and provenance `llm`.
    md = sa.MetaData()
    S, T, D = sa.String, sa.Text, sa.Double
    sa.Table(
        "region_kernels", md, sa.Column("digest", S, primary_key=True),
        sa.Column("arch", S, nullable=False), sa.Column("gpu", S, nullable=False),
        sa.Column("policy", S, nullable=False), sa.Column("dtype", S, nullable=False),
        sa.Column("ops", T, nullable=False), sa.Column("region", T, nullable=False),
        sa.Column("name", S, nullable=False), sa.Column("source", T, nullable=False),
        sa.Column("source_hash", S, nullable=False), sa.Column("build_key", S, nullable=False),
        sa.Column("nvcc_version", S, nullable=False), sa.Column("cutlass_version", S, nullable=False),
        sa.Column("time_ms", D), sa.Column("eager_ms", D), sa.Column("rel_err", D), sa.Column("eager_rel_err", D),
        sa.Column("device_name", S, nullable=False), sa.Column("provenance", S, nullable=False),
        sa.Column("status", S, nullable=False), sa.Column("model", S, nullable=False),
        sa.Column("explanation", T, nullable=False), sa.Column("created_at", S, nullable=False),
    )
    md.create_all(conn, checkfirst=True)


# --------------------------------------------------------------------------------------
# m005: one table per kind of row, every family in it. Everything below is frozen at schema 5.

_S5_ENV = ("gpu_sku", "driver_version", "cuda_version", "torch_version", "cublas_version", "cudnn_version",
           "cutlass_version", "nvcc_version")
_S5_LABELS = {"gpu_sku": "GPU", "driver_version": "driver", "cuda_version": "CUDA runtime", "torch_version": "torch",
              "cublas_version": "cuBLAS", "cudnn_version": "cuDNN", "cutlass_version": "CUTLASS",
              "nvcc_version": "nvcc"}
_S5_TRIAL_STATUSES = ("ok", "compile_error", "verify_failed", "launch_error", "timeout", "crashed", "skipped",
                      "build_failed")
# family -> (SHAPE fields, DIV fields), as fact_db.store.keys had them at schema 5
_S5_FAMILIES = {"gemm": (("m", "n", "k", "batch"), ("m", "n", "k")), "attention": (("batch", "lq", "lk"), ("lq", "lk")),
                "norm": (("rows",), ()), "region": ((), ())}
_S5_CARRIED = "carried over from registry schema 4"


def _s5_tables(md: sa.MetaData, indexed: bool, kernels: str, trials: str) -> tuple[sa.Table, sa.Table]:
    S, T, D = sa.String, sa.Text, sa.Double
    env = lambda: [sa.Column(c, S, nullable=False) for c in _S5_ENV]
    k = sa.Table(
        kernels, md, sa.Column("digest", S, primary_key=indexed, nullable=False),
        sa.Column("family", S, nullable=False), sa.Column("key", T, nullable=False),
        # near: a digest of the family, the non-shape key fields and the DIV classes (one
        # equality finds a nearest lookup's candidates); div: those classes as text; dims:
        # the SHAPE fields as JSON
        sa.Column("near", S, nullable=False), sa.Column("div", S, nullable=False),
        sa.Column("rule", S, nullable=False), sa.Column("arch", S, nullable=False), sa.Column("gpu", S, nullable=False),
        sa.Column("policy", S, nullable=False), sa.Column("dtype", S, nullable=False), sa.Column("dims", T, nullable=False),
        sa.Column("template", S, nullable=False), sa.Column("label", S, nullable=False),
        sa.Column("config", T, nullable=False), sa.Column("source_hash", S, nullable=False),
        sa.Column("template_hash", S, nullable=False), sa.Column("source", T, nullable=False), *env(),
        sa.Column("factdb_version", S, nullable=False), sa.Column("time_ms", D), sa.Column("baseline", S, nullable=False),
        sa.Column("baseline_ms", D), sa.Column("rel_err", D), sa.Column("baseline_rel_err", D),
        sa.Column("provenance", S, nullable=False), sa.Column("status", S, nullable=False),
        sa.Column("stale_reason", T, nullable=False), sa.Column("error", T, nullable=False),
        sa.Column("notes", T, nullable=False), sa.Column("created_at", S, nullable=False),
        sa.Column("updated_at", S, nullable=False),
    )
    t = sa.Table(
        trials, md, sa.Column("id", S, primary_key=indexed, nullable=False), sa.Column("digest", S, nullable=False),
        sa.Column("family", S, nullable=False), sa.Column("key", T, nullable=False),
        sa.Column("template", S, nullable=False), sa.Column("config", T, nullable=False),
        sa.Column("config_hash", S, nullable=False), sa.Column("status", S, nullable=False), sa.Column("time_ms", D),
        sa.Column("rel_err", D), sa.Column("error", T, nullable=False), sa.Column("template_hash", S, nullable=False),
        *env(), sa.Column("factdb_version", S, nullable=False), sa.Column("created_at", S, nullable=False),
    )
    return k, t


def _s5_json(v) -> str:
    return json.dumps(v, sort_keys=True, separators=(",", ":"))


def _s5_hex16(v) -> str:
    return hashlib.sha256(_s5_json(v).encode()).hexdigest()[:16]


def _s5_num(v):
    """A finite float or None (old trials JSON may hold NaN)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return float(v)


def _s5_gpu(gpu) -> str:
    return gpu or "unknown"   # schema 4 stored "" where no GPU was named; a key needs one


def _s5_key(family: str, key: dict, rule: str, dtype: str) -> dict:
    shape, div = _S5_FAMILIES[family]
    divs = [next((d for d in (128, 64, 16, 8) if key[f] % d == 0), 1) for f in div]
    return {"digest": _s5_hex16([family, key]), "family": family, "key": _s5_json(key),
            "near": _s5_hex16([family, {f: v for f, v in key.items() if f not in shape}, divs]),
            "div": ",".join(map(str, divs)), "rule": rule, "arch": key["arch"], "gpu": key["gpu"],
            "policy": key["policy"], "dtype": dtype, "dims": _s5_json({f: key[f] for f in shape})}


def _s5_status(status: str, reason: str, env: dict, updated_at: str, now: str) -> dict:
    unknown = [_S5_LABELS[c] for c in _S5_ENV if not env.get(c)]
    if status == "failed" or not unknown:
        return {"status": status, "stale_reason": reason, "updated_at": updated_at}
    why = f"{_S5_CARRIED}: {', '.join(unknown)} not recorded"
    return {"status": "stale", "stale_reason": why + (f"; before that: {reason}" if reason else ""), "updated_at": now}


def _s5_kernel(keycols: dict, env: dict, *, status: str, stale_reason: str = "", created_at: str, updated_at: str,
               now: str, **rest) -> dict:
    row = {**keycols, "template": "", "label": "", "config": "{}", "source_hash": "", "template_hash": "", "source": "",
           **{c: env.get(c) or "" for c in _S5_ENV}, "factdb_version": "", "time_ms": None, "baseline": "",
           "baseline_ms": None, "rel_err": None, "baseline_rel_err": None, "provenance": "rule", "error": "",
           "notes": "", "created_at": created_at}
    row.update(rest)
    row.update(_s5_status(status, stale_reason, env, updated_at or created_at, now))
    return row


def _s5_trial(keycols: dict, n: int, env: dict, *, template: str, config: dict, status: str, created_at: str,
              time_ms=None, rel_err=None, error: str = "", id: str = "", template_hash: str = "",
              factdb_version: str = "", config_hash: str = "") -> dict:
    if status not in _S5_TRIAL_STATUSES:
        status, error = "crashed", f"status {status}: {error}"
    # a carried trial's id sorts by its place in the old JSON (trials list oldest first, then by id)
    return {"id": id or _s5_hex16([keycols["digest"]]) + f"{n:016x}",
            "digest": keycols["digest"], "family": keycols["family"], "key": keycols["key"], "template": template,
            "config": _s5_json(config), "config_hash": config_hash or _s5_hex16(config), "status": status,
            "time_ms": _s5_num(time_ms), "rel_err": _s5_num(rel_err), "error": error or "",
            "template_hash": template_hash or "", **{c: env.get(c) or "" for c in _S5_ENV},
            "factdb_version": factdb_version or "", "created_at": created_at}


def _s5_gemm_key(r) -> dict:
    key = {f: r[f] for f in ("rule", "arch", "gpu", "dtype_in", "dtype_acc", "dtype_out", "layout_a", "layout_b",
                             "epilogue", "policy")}
    key.update({f: int(r[f]) for f in ("m", "n", "k", "batch")})
    return _s5_key("gemm", key, r["rule"], r["dtype_in"])


def _s5_gemm(conn, now: str) -> tuple[list, list]:
    kernels, trials, keys = [], [], {}
    for r in conn.execute(sa.text("select * from kernels")).mappings().all():
        kc = keys[r["digest"]] = _s5_gemm_key(r)
        env = {"gpu_sku": r["device_name"], "cutlass_version": r["cutlass_version"], "nvcc_version": r["nvcc_version"]}
        kernels.append(_s5_kernel(
            kc, env, status=r["status"], stale_reason=r["stale_reason"], created_at=r["created_at"],
            updated_at=r["updated_at"], now=now, template=r["template"], config=r["config"],
            source_hash=r["source_hash"], template_hash=r["template_hash"], factdb_version=r["factdb_version"],
            time_ms=r["time_ms"], baseline=r["baseline"], baseline_ms=r["baseline_ms"], rel_err=r["rel_err"],
            baseline_rel_err=r["baseline_rel_err"], provenance=r["provenance"], error=r["error"], notes=r["notes"]))
    for i, r in enumerate(conn.execute(sa.text("select * from trials")).mappings().all()):
        kc = keys.get(r["digest"]) or _s5_gemm_key(r)
        env = {"gpu_sku": r["device_name"], "cutlass_version": r["cutlass_version"], "nvcc_version": r["nvcc_version"]}
        trials.append(_s5_trial(kc, i, env, id=r["id"], template=r["template"], config=json.loads(r["config"]),
                                config_hash=r["config_hash"], status=r["status"], time_ms=r["time_ms"],
                                rel_err=r["rel_err"], error=r["error"], template_hash=r["template_hash"],
                                factdb_version=r["factdb_version"], created_at=r["created_at"]))
    return kernels, trials


def _s5_attention(conn, now: str) -> tuple[list, list]:
    kernels, trials = [], []
    kinds = {"library": "library", "eager": "eager"}   # an SDPA backend or the model's own form: no template
    for r in conn.execute(sa.text("select * from attention_kernels")).mappings().all():
        key = {"arch": r["arch"].replace("_", ""), "gpu": _s5_gpu(r["gpu"]), "causal": bool(r["causal"]),
               "scale": float(r["scale"]), "dtype": r["dtype"], "policy": r["policy"],
               **{f: int(r[f]) for f in ("batch", "heads", "kv_heads", "lq", "lk", "d", "dv")}}
        kc = _s5_key("attention", key, "attention", r["dtype"])
        env = {"gpu_sku": r["device_name"]}
        kernels.append(_s5_kernel(kc, env, status="verified", created_at=r["created_at"], updated_at="", now=now,
                                  template=kinds.get(r["kind"], r["template"]), label=r["label"],
                                  config=r["config"] or "{}", time_ms=r["time_ms"], rel_err=r["rel_err"]))
        for n, t in enumerate(json.loads(r["trials"] or "[]")):
            trials.append(_s5_trial(kc, n, env, template=kinds.get(t.get("kind"), t.get("template") or ""),
                                    config={**(t.get("config") or {}), "label": t.get("label", "")},
                                    status=t.get("status", ""), time_ms=t.get("time_ms"), rel_err=t.get("err"),
                                    error=t.get("error", ""), created_at=r["created_at"]))
    return kernels, trials


def _s5_norm(conn, now: str) -> tuple[list, list]:
    kernels, trials = [], []
    for r in conn.execute(sa.text("select * from norm_kernels")).mappings().all():
        key = {"arch": r["arch"].replace("_", ""), "gpu": _s5_gpu(r["gpu"]), "kind": r["kind"], "rows": int(r["rows"]),
               "width": int(r["width"]), "residual": bool(r["residual"]), "write_sum": bool(r["write_sum"]),
               "has_bias": bool(r["has_bias"]), "eps": float(r["eps"]), "dtype": r["dtype"], "policy": r["policy"]}
        kc = _s5_key("norm", key, r["kind"], r["dtype"])
        env = {"gpu_sku": r["device_name"]}
        kernels.append(_s5_kernel(kc, env, status="verified", created_at=r["created_at"], updated_at="", now=now,
                                  template=r["template"] or "eager", label=r["label"], config=r["config"] or "{}",
                                  source_hash=r["source_hash"], time_ms=r["time_ms"], rel_err=r["rel_err"],
                                  baseline="torch eager" if r["eager_ms"] is not None else "",
                                  baseline_ms=r["eager_ms"]))
        for n, t in enumerate(json.loads(r["trials"] or "[]")):
            label = t.get("label", "")
            trials.append(_s5_trial(kc, n, env, template="eager" if label == "eager" else (r["template"] or "add_norm"),
                                    config={"label": label}, status=t.get("status", ""), time_ms=t.get("time_ms"),
                                    rel_err=t.get("err"), error=t.get("error") or "", created_at=r["created_at"]))
    return kernels, trials


def _s5_region_key(spec: dict, arch: str, gpu: str) -> dict:
    rename = {x["name"]: f"in{i}" for i, x in enumerate(spec["inputs"])}
    rename.update({o["name"]: f"op{i}" for i, o in enumerate(spec["ops"])})

    def canon(a):
        if isinstance(a, dict) and "ref" in a:
            return {"ref": rename[a["ref"]]}
        return [canon(x) for x in a] if isinstance(a, (list, tuple)) else a
    key = {"arch": arch.replace("_", ""), "gpu": _s5_gpu(gpu), "policy": spec["policy"], "dtype": spec["dtype"],
           "ops": _s5_json([[o["op"], o["overload"], canon(o["args"])] for o in spec["ops"]]),
           "inputs": _s5_json([list(x["shape"]) for x in spec["inputs"]]), "out": _s5_json(list(spec["out_shape"]))}
    return _s5_key("region", key, "llm-region", spec["dtype"])


def _s5_region(conn, now: str) -> list:
    kernels = []
    for r in conn.execute(sa.text("select * from region_kernels")).mappings().all():
        kc = _s5_region_key(json.loads(r["region"]), r["arch"], r["gpu"])
        nvcc = "" if r["nvcc_version"].startswith("(none") else r["nvcc_version"]
        env = {"gpu_sku": r["device_name"], "cutlass_version": r["cutlass_version"], "nvcc_version": nvcc}
        kernels.append(_s5_kernel(
            kc, env, status=r["status"], created_at=r["created_at"], updated_at="", now=now, template="llm_region",
            label=r["name"], config=_s5_json({"build_key": r["build_key"], "model": r["model"]}),
            source=r["source"], source_hash=r["source_hash"], time_ms=r["time_ms"], baseline="torch eager",
            baseline_ms=r["eager_ms"], rel_err=r["rel_err"], baseline_rel_err=r["eager_rel_err"],
            provenance=r["provenance"], notes=r["explanation"]))
    return kernels


def _m005_families(conn: sa.Connection) -> None:
    indexed = conn.dialect.name != "duckdb"   # as m001 explains
    now = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()) + ".000000Z"
    md = sa.MetaData()
    k_new, t_new = _s5_tables(md, indexed, "kernels_s5", "trials_s5")
    md.create_all(conn, checkfirst=False)
    kernels, trials = _s5_gemm(conn, now)
    for fam in (_s5_attention, _s5_norm):
        k, t = fam(conn, now)
        kernels += k
        trials += t
    kernels += _s5_region(conn, now)
    unique: dict = {}
    for row in kernels:   # one row per key (never two in practice: the old keys were unique too)
        if row["digest"] not in unique or row["created_at"] > unique[row["digest"]]["created_at"]:
            unique[row["digest"]] = row
    for i in range(0, len(unique), 20000):
        insert_rows(conn, k_new, list(unique.values())[i:i + 20000])
    for i in range(0, len(trials), 20000):
        insert_rows(conn, t_new, trials[i:i + 20000])
    for old in ("kernels", "trials", "attention_kernels", "norm_kernels", "region_kernels"):
        conn.exec_driver_sql(f"DROP TABLE {old}")
    conn.exec_driver_sql("ALTER TABLE kernels_s5 RENAME TO kernels")
    conn.exec_driver_sql("ALTER TABLE trials_s5 RENAME TO trials")
    if indexed:
        conn.exec_driver_sql("CREATE INDEX ix_kernels_near ON kernels (near)")
        conn.exec_driver_sql("CREATE INDEX ix_trials_digest ON trials (digest, config_hash)")


def _m006_team(conn: sa.Connection) -> None:
    # Small tables: keys and indexes on every backend but DuckDB, where deleting and inserting
    # one key in one transaction trips its unique index (the writers below never need it there).
    indexed = conn.dialect.name != "duckdb"
    md = sa.MetaData()
    S, T, Z = sa.String, sa.Text, sa.DateTime(timezone=True)
    sa.Table(
        "leases", md, sa.Column("digest", S, primary_key=indexed, nullable=False),
        sa.Column("family", S, nullable=False), sa.Column("key", T, nullable=False),
        sa.Column("holder", S, nullable=False), sa.Column("host", S, nullable=False),
        sa.Column("pid", sa.Integer, nullable=False), sa.Column("taken_at", Z, nullable=False),
        sa.Column("expires_at", Z, nullable=False),
    )
    sa.Table(
        "outbox", md, sa.Column("kind", S, primary_key=indexed, nullable=False),
        sa.Column("id", S, primary_key=indexed, nullable=False), sa.Column("queued_at", S, nullable=False),
    )
    md.create_all(conn, checkfirst=False)


def _m007_binaries(conn: sa.Connection) -> None:
    indexed = conn.dialect.name != "duckdb"   # as m006
    md = sa.MetaData()
    S = sa.String
    sa.Table(
        "kernel_binaries", md, sa.Column("build_key", S, primary_key=indexed, nullable=False),
        sa.Column("sha256", S, nullable=False), sa.Column("size", sa.Integer, nullable=False),
        sa.Column("arch", S, nullable=False), sa.Column("host", S, nullable=False),
        sa.Column("created_at", S, nullable=False), sa.Column("data", sa.LargeBinary, nullable=False),
    )
    md.create_all(conn, checkfirst=False)


MIGRATIONS: list[tuple[int, str, object]] = [
    (1, "m001_initial", _m001_initial),
    (2, "m002_attention", _m002_attention),
    (3, "m003_norms", _m003_norms),
    (4, "m004_region_kernels", _m004_region_kernels),
    (5, "m005_families", _m005_families),
    (6, "m006_team", _m006_team),
    (7, "m007_binaries", _m007_binaries),
]
# Versions increase and the last is SCHEMA_VERSION (helper branches number theirs apart, so
# a gap may exist until they merge: 2 is attention's).
assert [v for v, _, _ in MIGRATIONS] == sorted({v for v, _, _ in MIGRATIONS}) and MIGRATIONS[-1][0] == SCHEMA_VERSION
