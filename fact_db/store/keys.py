"""Registry keys: what a tuned kernel is for, one frozen dataclass per family, one digest scheme.

    >>> k = GemmKey(rule="gemm-bias", arch="sm_90a", gpu="NVIDIA H100 80GB HBM3", dtype_in="bf16",
    ...             dtype_acc="float32", dtype_out="bf16", layout_a="row", layout_b="col",
    ...             m=4096, n=4096, k=1024, batch=1, epilogue="bias", policy="bf16")
    >>> k.arch, k.gpu, k.summary
    ('sm90a', 'h100', 'gemm-bias 4096x4096x1024 bf16')
    >>> len(k.digest()), k.div, k.distance(k.with_(m=2048))
    (16, '128,128,128', 1.0)
    >>> Key.from_dict("gemm", k.as_dict()) == k
    True

Every family has `arch` (canonical_arch: sm_90a -> sm90a), `gpu` (canonical_gpu: the short
model name, h100; the full SKU, which tells SXM from PCIe, is in the row's environment) and
`policy`, all checked on construction with a one-sentence error naming the field.

Digest (the registry's primary key, and the JSONL files'): the first 16 hex digits of sha256
over `json.dumps([FAMILY, {field: value, ...}], sort_keys=True, separators=(",", ":"))`, the
same for every family, so a key digests alike on every backend and machine
(tests/test_registry.py pins one). `near()` digests the family, the fields that are not SHAPE
fields, and the divisibility classes of the DIV fields: the rows a nearest-shape lookup may
return share it. A family with no SHAPE fields is looked up exactly.

Adding a family is one subclass here (ConvKey was): its FAMILY, fields, SHAPE, DIV,
checks and summary; nothing else in fact_db.store changes.
"""
from __future__ import annotations

import dataclasses
import hashlib
import inspect
import json
import math
import re
from typing import ClassVar

from fact_db.core.device import DeviceError, canonical_arch, canonical_gpu
from fact_db.core.policy import POLICIES
from fact_db.store.errors import RegistryError

DTYPES = ("float32", "float16", "bfloat16", "float64", "float8_e4m3fn", "float8_e5m2", "int8", "int32")
DTYPE_ALIASES = {"fp32": "float32", "float": "float32", "f32": "float32", "fp16": "float16", "half": "float16",
                 "f16": "float16", "bf16": "bfloat16", "fp64": "float64", "double": "float64"}
SHORT_DTYPE = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16", "float64": "fp64",
               "float8_e4m3fn": "e4m3", "float8_e5m2": "e5m2", "int8": "int8", "int32": "int32"}
DIV_CLASSES = (128, 64, 16, 8)
SLUG = re.compile(r"[a-z0-9][a-z0-9_.-]*")


def div_class(x: int) -> int:
    """The largest of 128, 64, 16, 8 that divides `x`, else 1."""
    return next((d for d in DIV_CLASSES if x % d == 0), 1)


def _hex16(value) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]


def canonical_json(value) -> str:
    """The one JSON text of a value (sorted keys, no spaces): what the key columns and digests hold."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


# ---- field checks: each returns the canonical value or raises naming the field

def _text(name: str, v) -> str:
    if not isinstance(v, str) or not v:
        raise RegistryError(f"key field {name} must be a non-empty string, got {v!r}")
    return v


def _slug(name: str, v, example: str) -> str:
    if not SLUG.fullmatch(_text(name, v)):
        raise RegistryError(f"key field {name} is {v!r}; use lowercase letters, digits, '-' and '_' (e.g. {example})")
    return v


def _pos_int(name: str, v) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise RegistryError(f"key field {name} must be a positive integer, got {v!r}")
    return v


def _flag(name: str, v) -> bool:
    if not isinstance(v, bool):
        raise RegistryError(f"key field {name} must be true or false, got {v!r}")
    return v


def _real(name: str, v, *, positive: bool) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0 or (positive and v == 0):
        raise RegistryError(f"key field {name} must be a finite {'positive' if positive else 'non-negative'} number, "
                            f"got {v!r}")
    return float(v)   # 1 and 1.0 are one key: the digest sees the float


def _dtype(name: str, v) -> str:
    v = DTYPE_ALIASES.get(v, v) if isinstance(v, str) else v
    if v not in DTYPES:
        raise RegistryError(f"key field {name} is {v!r}; use one of {', '.join(DTYPES)}")
    return v


def _choice(name: str, v, choices: tuple) -> str:
    if v not in choices:
        raise RegistryError(f"key field {name} is {v!r}; use {' or '.join(choices)}")
    return v


def _json_text(name: str, v, check) -> str:
    """A field that holds JSON text: parsed, checked, and rewritten canonically."""
    try:
        data = json.loads(v) if isinstance(v, str) else None
    except ValueError:
        data = None
    if data is None or not check(data):
        raise RegistryError(f"key field {name} must be JSON text of {check.__doc__}, got {str(v)[:80]!r}")
    return canonical_json(data)


def _shape_list(x) -> bool:
    """a list of non-negative integers (a tensor shape)"""
    return isinstance(x, list) and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in x)


def _shape_lists(x) -> bool:
    """a list of tensor shapes (lists of non-negative integers)"""
    return isinstance(x, list) and all(_shape_list(s) for s in x)


def _op_list(x) -> bool:
    """a non-empty list of [op, overload, args] (the region's ATen ops)"""
    return isinstance(x, list) and bool(x) and all(
        isinstance(o, list) and len(o) == 3 and isinstance(o[0], str) and isinstance(o[1], str) for o in x)


# --------------------------------------------------------------------------------------

class Key:
    """The base of every family's key (a mixin: each family is a frozen dataclass of its own fields).

    ClassVars: FAMILY (the family's name, also its registry name), SHAPE (fields a nearest
    lookup may vary: positive integers), DIV (SHAPE fields whose divisibility class must match).
    """

    FAMILY: ClassVar[str] = ""
    SHAPE: ClassVar[tuple[str, ...]] = ()
    DIV: ClassVar[tuple[str, ...]] = ()
    FIELDS: ClassVar[tuple[str, ...]] = ()
    _families: ClassVar[dict[str, type[Key]]] = {}

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        if cls.FAMILY:
            if cls.FAMILY in Key._families:
                raise TypeError(f"two key classes for family {cls.FAMILY!r}")
            Key._families[cls.FAMILY] = cls
            ann = inspect.get_annotations(cls)
            cls.FIELDS = tuple(n for n, t in ann.items() if not str(t).startswith(("ClassVar", "typing.ClassVar")))

    def _check_common(self) -> None:
        try:
            object.__setattr__(self, "arch", canonical_arch(self.arch))
        except DeviceError:
            raise RegistryError(f"key field arch is {self.arch!r}; use a compute capability such as sm90a or sm80") \
                from None
        if not isinstance(self.gpu, str):
            raise RegistryError(f"key field gpu must be a GPU name such as h100, got {self.gpu!r}")
        try:
            object.__setattr__(self, "gpu", canonical_gpu(self.gpu))
        except DeviceError as e:
            raise RegistryError(f"key field gpu: {e}") from None
        if self.policy not in POLICIES:
            raise RegistryError(f"key field policy is {self.policy!r}; use one of {', '.join(POLICIES)}")

    # ---- identity
    def as_dict(self) -> dict:
        return {f: getattr(self, f) for f in self.FIELDS}

    def digest(self) -> str:
        """16 hex digits of sha256 over [FAMILY, the fields] (see the module docstring)."""
        return _hex16([self.FAMILY, self.as_dict()])

    @property
    def div_classes(self) -> tuple[int, ...]:
        return tuple(div_class(getattr(self, f)) for f in self.DIV)

    @property
    def div(self) -> str:
        """The DIV classes as text (`128,128,64`): a column the nearest lookup filters on."""
        return ",".join(map(str, self.div_classes))

    def near(self) -> str:
        """16 hex digits over FAMILY, the non-shape fields and the DIV classes: rows a nearest
        lookup may return for this key share it."""
        rest = {f: getattr(self, f) for f in self.FIELDS if f not in self.SHAPE}
        return _hex16([self.FAMILY, rest, list(self.div_classes)])

    def dims(self) -> dict:
        """The SHAPE fields."""
        return {f: getattr(self, f) for f in self.SHAPE}

    def distance(self, other: Key) -> float:
        """Sum of |log2 ratio| over the SHAPE fields (0.0: same shape; doubling one costs 1.0)."""
        return sum(abs(math.log2(getattr(self, f) / getattr(other, f))) for f in self.SHAPE)

    def compatible(self, other: Key) -> bool:
        """Same family, same non-shape fields and the same divisibility classes."""
        return type(self) is type(other) and self.near() == other.near()

    def with_(self, **changes) -> Key:
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_dict(cls, family: str, fields: dict) -> Key:
        """The key of `family` from a mapping of its fields (other entries are ignored)."""
        kc = cls.family_class(family)
        if not isinstance(fields, dict):
            raise RegistryError(f"the {family} key must be a JSON object, got {type(fields).__name__}")
        missing = [f for f in kc.FIELDS if f not in fields]
        if missing:
            raise RegistryError(f"key fields missing: {', '.join(missing)}")
        return kc(**{f: fields[f] for f in kc.FIELDS})

    @classmethod
    def family_class(cls, family: str) -> type[Key]:
        if family not in Key._families:
            raise RegistryError(f"family {family!r} is not one of {', '.join(sorted(Key._families))} (a newer "
                                "fact-db's row, or a typo)")
        return Key._families[family]

    @staticmethod
    def families() -> dict[str, type[Key]]:
        return dict(Key._families)

    # ---- what the storage and listings show
    @property
    def rule_name(self) -> str:
        """The `rule` column: the GEMM rule, else the family's natural name for the row."""
        return self.FAMILY

    @property
    def dtype_name(self) -> str:
        """The `dtype` column: the operand dtype."""
        return self.dtype

    @property
    def shape(self) -> str:
        return "x".join(str(getattr(self, f)) for f in self.SHAPE)

    @property
    def summary(self) -> str:
        """One short line for listings."""
        return f"{self.FAMILY} {self.shape} {SHORT_DTYPE.get(self.dtype_name, self.dtype_name)}"

    def words(self) -> str:
        """The key's non-shape fields in words, for the index (kernels that differ only in shape
        share a description, so they share an embedding)."""
        return "; ".join(f"{f} {str(v).lower() if isinstance(v, bool) else v}" for f, v in self.as_dict().items()
                         if f not in self.SHAPE and f not in ("arch", "gpu", "policy", "dtype"))


# --------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class GemmKey(Key):
    """A GEMM (with its epilogue) kernel's key. Two kernels with the same key are interchangeable.

    dtype aliases (fp32, bf16, ...) become torch names on construction.

    >>> GemmKey.parse_shape("512x2048x1024x8")
    (512, 2048, 1024, 8)
    """

    FAMILY = "gemm"
    SHAPE = ("m", "n", "k", "batch")
    DIV = ("m", "n", "k")

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
            _text(name, getattr(self, name))
        self._check_common()
        for name in ("dtype_in", "dtype_acc", "dtype_out"):
            object.__setattr__(self, name, _dtype(name, getattr(self, name)))
        for name in ("layout_a", "layout_b"):
            _choice(name, getattr(self, name), ("row", "col"))
        _slug("rule", self.rule, "gemm-bias-gelu-tanh")
        _slug("epilogue", self.epilogue, "bias_gelu_tanh")
        for name in self.SHAPE:
            _pos_int(name, getattr(self, name))

    @property
    def rule_name(self) -> str:
        return self.rule

    @property
    def dtype_name(self) -> str:
        return self.dtype_in

    @property
    def shape(self) -> str:
        return f"{self.m}x{self.n}x{self.k}" + (f"x{self.batch}" if self.batch > 1 else "")

    @property
    def summary(self) -> str:
        return f"{self.rule} {self.shape} {SHORT_DTYPE[self.dtype_in]}"

    @staticmethod
    def parse_shape(text: str) -> tuple[int, int, int, int]:
        """`MxNxK` or `MxNxKxB` -> (M, N, K, batch); batch is 1 when absent."""
        m = re.fullmatch(r"\s*(\d+)\s*[xX]\s*(\d+)\s*[xX]\s*(\d+)\s*(?:[xX]\s*(\d+)\s*)?", text or "")
        if not m:
            raise RegistryError(f"shape {text!r} is not MxNxK or MxNxKxB; write e.g. 4096x4096x4096, or "
                                "512x2048x1024x8 for a batch of 8")
        dims = tuple(int(g) if g else 1 for g in m.groups())
        if min(dims) < 1:
            raise RegistryError(f"shape {text!r}: every dimension must be at least 1")
        return dims  # type: ignore[return-value]


KernelKey = GemmKey  # the name most callers know


@dataclasses.dataclass(frozen=True)
class AttentionKey(Key):
    """softmax(scale * q k^T [causal]) v over `heads` query heads sharing `kv_heads` KV heads.

    Nearest rows may differ in batch and the two sequence lengths (each length's divisibility
    class must match: a tile config may rely on it); head counts, head dims, causal, scale,
    dtype and policy must be equal.
    """

    FAMILY = "attention"
    SHAPE = ("batch", "lq", "lk")
    DIV = ("lq", "lk")

    arch: str
    gpu: str
    batch: int
    heads: int
    kv_heads: int
    lq: int
    lk: int
    d: int
    dv: int
    causal: bool
    scale: float
    dtype: str
    policy: str

    def __post_init__(self):
        self._check_common()
        for name in ("batch", "heads", "kv_heads", "lq", "lk", "d", "dv"):
            _pos_int(name, getattr(self, name))
        if self.heads % self.kv_heads:
            raise RegistryError(f"key field heads={self.heads} is not a multiple of kv_heads={self.kv_heads}")
        _flag("causal", self.causal)
        object.__setattr__(self, "scale", _real("scale", self.scale, positive=True))
        object.__setattr__(self, "dtype", _dtype("dtype", self.dtype))

    @property
    def shape(self) -> str:
        return f"{self.lq}x{self.lk}"

    @property
    def summary(self) -> str:
        kv = f"/{self.kv_heads}kv" if self.kv_heads != self.heads else ""
        dv = f"/{self.dv}" if self.dv != self.d else ""
        return (f"attention{'-causal' if self.causal else ''} {self.batch}x{self.heads}{kv} {self.lq}x{self.lk} "
                f"d{self.d}{dv} {SHORT_DTYPE[self.dtype]}")


@dataclasses.dataclass(frozen=True)
class NormKey(Key):
    """A layernorm or rmsnorm over `rows` rows of `width`, optionally adding a residual first
    (and writing the sum). Nearest rows may differ in `rows`; everything else is exact."""

    FAMILY = "norm"
    SHAPE = ("rows",)

    arch: str
    gpu: str
    kind: str
    rows: int
    width: int
    residual: bool
    write_sum: bool
    has_bias: bool
    eps: float
    dtype: str
    policy: str

    def __post_init__(self):
        self._check_common()
        _choice("kind", self.kind, ("layernorm", "rmsnorm"))
        _pos_int("rows", self.rows)
        _pos_int("width", self.width)
        for name in ("residual", "write_sum", "has_bias"):
            _flag(name, getattr(self, name))
        object.__setattr__(self, "eps", _real("eps", self.eps, positive=False))
        object.__setattr__(self, "dtype", _dtype("dtype", self.dtype))

    @property
    def rule_name(self) -> str:
        return self.kind

    @property
    def shape(self) -> str:
        return f"{self.rows}x{self.width}"

    @property
    def summary(self) -> str:
        extra = "".join(f" +{w}" for w, on in (("residual", self.residual), ("sum", self.write_sum),
                                               ("bias", self.has_bias)) if on)
        return f"{self.kind} {self.shape}{extra} {SHORT_DTYPE[self.dtype]}"


@dataclasses.dataclass(frozen=True)
class RegionKey(Key):
    """A region of ATen ops the language model wrote a kernel for (fact_db/kernels/region):
    its ops with their constant arguments (node references renamed in0.., op0..), the input
    and output shapes, as canonical JSON text. Looked up exactly.

    >>> RegionKey.of(spec.as_dict(), "sm90a", "h100").summary
    'region relu 8x64 fp32'
    """

    FAMILY = "region"

    arch: str
    gpu: str
    policy: str
    dtype: str
    ops: str
    inputs: str
    out: str

    def __post_init__(self):
        self._check_common()
        object.__setattr__(self, "dtype", _dtype("dtype", self.dtype))
        object.__setattr__(self, "ops", _json_text("ops", self.ops, _op_list))
        object.__setattr__(self, "inputs", _json_text("inputs", self.inputs, _shape_lists))
        object.__setattr__(self, "out", _json_text("out", self.out, _shape_list))

    @classmethod
    def of(cls, spec: dict, arch: str, gpu: str) -> RegionKey:
        """The key of a RegionSpec's as_dict(): node names do not count (the same region
        elsewhere in a graph is the same key), as in RegionSpec.digest."""
        try:
            rename = {x["name"]: f"in{i}" for i, x in enumerate(spec["inputs"])}
            rename.update({o["name"]: f"op{i}" for i, o in enumerate(spec["ops"])})

            def canon(a):
                if isinstance(a, dict) and "ref" in a:
                    return {"ref": rename[a["ref"]]}
                return [canon(x) for x in a] if isinstance(a, (list, tuple)) else a
            ops = [[o["op"], o["overload"], canon(o["args"])] for o in spec["ops"]]
            inputs = [list(x["shape"]) for x in spec["inputs"]]
            out, policy, dtype = list(spec["out_shape"]), spec["policy"], spec["dtype"]
        except (KeyError, TypeError) as e:
            raise RegistryError(f"region spec is missing or has a malformed {e} (pass RegionSpec.as_dict())") from None
        return cls(arch=arch, gpu=gpu, policy=policy, dtype=dtype, ops=canonical_json(ops),
                   inputs=canonical_json(inputs), out=canonical_json(out))

    @property
    def rule_name(self) -> str:
        return "llm-region"

    @property
    def shape(self) -> str:
        return "x".join(map(str, json.loads(self.out))) or "scalar"

    @property
    def summary(self) -> str:
        return f"region {'+'.join(self._op_names())} {self.shape} {SHORT_DTYPE[self.dtype]}"

    def words(self) -> str:
        return f"ops {', '.join(self._op_names())}; {len(json.loads(self.inputs))} inputs"

    def _op_names(self) -> list[str]:
        return [o[0].split(".", 1)[-1] for o in json.loads(self.ops)]


def _dims_text(name: str, v) -> str:
    if not isinstance(v, str) or not re.fullmatch(r"\d+(x\d+){0,2}", v):
        raise RegistryError(f"key field {name} is {v!r}; write one to three sizes joined by x, e.g. 3x3")
    return v


@dataclasses.dataclass(frozen=True)
class ConvKey(Key):
    """A convolution kernel's key: its full geometry (batch, channels, spatial sizes joined by
    x, filter, stride, padding, dilation, output padding, groups, transposed), the operand
    dtype, the activation layout, the epilogue (bias, and the chain after the conv as
    canonical JSON) and the policy. Nearest rows may differ in batch only.

    >>> ConvKey(rule="conv-bn", arch="sm90a", gpu="h100", dtype="bf16", layout="nhwc", n=8, c=64, k=64,
    ...         input="56x56", filter="3x3", stride="1x1", padding="1x1", dilation="1x1", output_padding="0x0",
    ...         groups=1, transposed=False, bias=True, chain='[{"op":"relu"}]', policy="bf16").summary
    'conv-bn N8 C64 K64 56x56 f3x3 bf16'
    """

    FAMILY = "conv"
    SHAPE = ("n",)

    rule: str
    arch: str
    gpu: str
    dtype: str
    layout: str
    n: int
    c: int
    k: int
    input: str
    filter: str
    stride: str
    padding: str
    dilation: str
    output_padding: str
    groups: int
    transposed: bool
    bias: bool
    chain: str
    policy: str

    def __post_init__(self):
        self._check_common()
        _slug("rule", self.rule, "conv-bn")
        object.__setattr__(self, "dtype", _dtype("dtype", self.dtype))
        _choice("layout", self.layout, ("nhwc", "nchw"))
        for name in ("n", "c", "k", "groups"):
            _pos_int(name, getattr(self, name))
        for name in ("input", "filter", "stride", "padding", "dilation", "output_padding"):
            _dims_text(name, getattr(self, name))
        if len({len(getattr(self, f).split("x")) for f in ("input", "filter", "stride", "padding", "dilation")}) != 1:
            raise RegistryError(f"key fields input={self.input} filter={self.filter} stride={self.stride} "
                                f"padding={self.padding} dilation={self.dilation} must have one size per spatial dim")
        _flag("transposed", self.transposed)
        _flag("bias", self.bias)
        object.__setattr__(self, "chain", _json_text("chain", self.chain, _chain_list))

    @property
    def rule_name(self) -> str:
        return self.rule

    @property
    def shape(self) -> str:
        return f"N{self.n} C{self.c} K{self.k} {self.input} f{self.filter}"

    @property
    def summary(self) -> str:
        return f"{self.rule} {self.shape} {SHORT_DTYPE[self.dtype]}"


def _chain_list(x) -> bool:
    """a list of chain steps, each an object with an `op`"""
    return isinstance(x, list) and all(isinstance(s, dict) and isinstance(s.get("op"), str) for s in x)
