"""The index's documents: shipped rules, vetted CUTLASS examples (read from the installed
nvidia-cutlass package, with the curated notes in index/examples.yaml) and registry kernels.

    >>> docs = rule_docs() + example_docs() + kernel_docs(registry)
    >>> docs[0].id, docs[0].kind, docs[0].archs
    ('attention', 'rule', ['sm90', 'sm80'])

Each document has a BM25 body, an embedding text and filter tags (`archs`, `dtypes`, `ops`).
Examples get their tags from their directory name, their sources (ArchTag, element types)
and the curated notes, which take precedence. A kernel is named by its key digest; kernels
with one description share one embedding text (it leaves out their exact shape).
"""
from __future__ import annotations

import functools
import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from fact_db.core import paths
from fact_db.store.index.tags import (
    _TORCH_DTYPE,
    ARCH_WORDS,
    DTYPE_WORDS,
    KINDS,  # noqa: F401
    IndexError_,
    lexical_normalize,
    norm_arch,
    norm_dtype,
)


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

    `row` is a KernelRecord or its as_dict() form (digest, family, the key fields, template,
    config, time_ms, gpu_sku, status, ...). A GEMM row's text names its rule, GPU, dtypes,
    policy, epilogue, layouts and shape class; another family's names its key's non-shape
    fields (family_doc).
    """
    r = row.as_dict() if hasattr(row, "as_dict") else row
    if r.get("family", "gemm") != "gemm":
        return family_doc(r, rule_titles, rule_families)
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
                     "device_name": _device(r), "status": r["status"],
                     "stale_reason": r.get("stale_reason", ""), "provenance": r.get("provenance", "")})


def _device(r) -> str:
    return r.get("gpu_sku") or r.get("device_name") or ""


def family_doc(r: dict, rule_titles: dict | None = None, rule_families: dict | None = None) -> Doc:
    """The document of a non-GEMM kernel (attention, norm, region, ...): generic words from its
    key's fields, its shape left out so that kernels of one description share an embedding."""
    from fact_db.store.keys import SHORT_DTYPE, Key
    key = Key.from_dict(r["family"], r)
    rule, arch = key.rule_name, norm_arch(key.arch)
    dtype = key.dtype_name
    dts = _uniq([_TORCH_DTYPE.get(dtype, dtype)] + (["tf32"] if key.policy in ("tf32", "tf32x3") else []))
    title_r = (rule_titles or {}).get(rule, rule)
    winner = r.get("template") or "library"
    if r.get("label") and r["label"] != winner:
        winner += f" ({r['label']})"
    text = (f"{title_r}: tuned {key.FAMILY} kernel ({rule}) on {key.gpu.upper()} ({key.arch}, "
            f"{ARCH_WORDS.get(arch, '')}); {dtype} ({SHORT_DTYPE.get(dtype, dtype)}), precision policy {key.policy}; "
            f"{key.words()}; winner {winner}; status {r['status']}.")
    config = r.get("config") or {}
    if isinstance(config, str):
        config = json.loads(config or "{}")
    t, b = r.get("time_ms"), r.get("baseline_ms")
    return Doc(id=r["digest"], kind="kernel", title=f"{key.summary} {key.gpu} {key.policy}", body=text,
               embed_text=text, archs=[arch], dtypes=dts,
               ops=_uniq([key.FAMILY, rule, (rule_families or {}).get(rule)]),
               features=_uniq([key.policy, r.get("template"), r.get("label")]),
               meta={"family": key.FAMILY, "rule": rule, "arch": key.arch, "gpu": key.gpu, "shape": key.shape,
                     "summary": key.summary, "key": key.as_dict(), "dtype_in": dtype, "dtype_out": dtype,
                     "epilogue": "-", "policy": key.policy, "template": r.get("template", ""),
                     "label": r.get("label", ""), "config": config, "time_ms": t, "baseline_ms": b,
                     "speedup": round(b / t, 4) if t and b else None, "device_name": _device(r),
                     "status": r["status"], "stale_reason": r.get("stale_reason", ""),
                     "provenance": r.get("provenance", "")})


_KERNEL_COLUMNS = ("digest", "family", "key", "template", "label", "config", "time_ms", "baseline_ms", "gpu_sku",
                   "status", "stale_reason", "provenance")


def _kernel_rows(registry) -> list[dict]:
    """The registry's non-failed rows as as_dict()-like mappings. Reads the columns directly
    (2 s for 100,000 rows, where registry.rows() builds and checks a KernelRecord per row in 8 s)."""
    import sqlalchemy as sa

    from fact_db.store.tables import K
    cols = [K.c[c] for c in _KERNEL_COLUMNS]
    with registry.transaction(write=False) as conn:
        rows = conn.execute(sa.select(*cols).where(K.c.status != "failed").order_by(K.c.digest)).all()
    out = []
    for row in rows:
        d = dict(zip(_KERNEL_COLUMNS, row))
        out.append({**json.loads(d.pop("key")), **d})
    return out


def kernel_docs(registry, ruleset=None) -> list[Doc]:
    """Documents for the registry's rows of every family (failed rows are not indexed)."""
    titles = {r.id: r.title for r in ruleset or []}
    families = {r.id: r.family for r in ruleset or []}
    return [kernel_doc(row, titles, families) for row in _kernel_rows(registry)]
