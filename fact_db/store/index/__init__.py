"""The hybrid index: rules, vetted CUTLASS examples and registry kernels, searched by BM25 and
by embedding, fused, and filtered so results never cross hardware.

    >>> from fact_db.store import index
    >>> report = index.build()                               # incremental; builds what changed
    >>> index.search("stream-K gemm on ampere", n=5).hits[0].id
    'examples/47_ampere_gemm_universal_streamk'
    >>> index.lookup("gemm", "4096x4096x4096", arch="sm90")[0].exact   # a structured registry lookup

Modules: `tags` (kinds, arch and dtype tags), `docs` (the documents), `build` (the tables, the
search file, status), `search` (search and the structured lookup). The names callers use are
re-exported here; `index.build` and `index.search` are the functions, so reach the modules
themselves through importlib.import_module("fact_db.store.index.build") (or `from
fact_db.store.index.build import ...`).
"""
from __future__ import annotations

from fact_db.store.index.build import (  # noqa: F401
    DIM,
    FORMAT,
    HNSW_MIN,
    SCHEMA_VERSION,
    SHIPPED_VECTORS,
    BuildReport,
    _close_searchers,
    _connect,
    _ext_path,
    _insert_columns,
    _load_ext,
    _meta,
    _tables,
    build,
    collect_docs,
    hnsw_min,
    search_path,
    ship_vectors,
    status,
    store_path,
)
from fact_db.store.index.docs import (  # noqa: F401
    NOTES_FILE,
    Doc,
    example_dirs,
    example_docs,
    family_doc,
    kernel_doc,
    kernel_docs,
    load_notes,
    rule_docs,
    shape_class,
)
from fact_db.store.index.search import (  # noqa: F401
    FUSION,
    POOL,
    RELEVANCE_FLOOR,
    Hit,
    KernelMatch,
    SearchResult,
    _fuse,
    _searcher,
    _vec_literal,
    lookup,
    ranked,
    rule_families,
    rules_for_op,
    search,
)
from fact_db.store.index.tags import (  # noqa: F401
    ARCH_ALIASES,
    ARCH_WORDS,
    DTYPE_ALIASES,
    DTYPE_WORDS,
    KINDS,
    IndexError_,
    lexical_normalize,
    norm_arch,
    norm_dtype,
)
