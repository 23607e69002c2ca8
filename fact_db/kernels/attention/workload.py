"""Attention: one scaled-dot-product attention problem to realize -- batch, heads, KV heads,
query and key lengths, head dims, causal or not, scale, precision policy -- with what it
takes to check and time it, and the library candidates that always compete.

    >>> w = AttentionWorkload(batch=128, heads=8, kv_heads=8, lq=512, lk=512, d=96, dv=96,
    ...                       causal=True, policy="fp32")
    >>> x = w.make_inputs("randn", device="cuda")
    >>> w.reference(x)                     # float64, explicit softmax(scale q k^T) v
    >>> library_op("efficient")(x["q"], x["k"], x["v"], w.softmax_scale, True)

Tensors are in SDPA's layout: q [batch, heads, lq, d], k [batch, kv_heads, lk, d],
v [batch, kv_heads, lk, dv], output [batch, heads, lq, dv]. `causal` is top-left aligned as
in `scaled_dot_product_attention(is_causal=True)`: key j is visible to query i iff j <= i.

The library candidates (DESIGN.md, "Attention and the agent"): `sdpa` (PyTorch's own
dispatch, left in the graph as `aten.scaled_dot_product_attention`) and each SDPA backend
forced on its own (`flash`, `efficient`, `cudnn`, `math`), registered as `torch.library`
custom ops so that a composed module keeps the backend under torch.compile and in CUDA
graphs. `explicit` is the model's own ops (matmul, softmax, matmul), what the user had.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace

from fact_db.core.errors import FactError
from fact_db.core.policy import DTYPE_ALIASES, POLICIES, POLICY_DTYPE, policy_mode
from fact_db.kernels.attention.kernel import attention_fake, empty_out, out_strides

# SDPA backends fact-db can force, and the operand dtypes each accepts.
BACKENDS = {
    "flash": ("float16", "bfloat16"),
    "efficient": ("float32", "float16", "bfloat16"),
    "cudnn": ("float16", "bfloat16"),
    "math": ("float32", "float16", "bfloat16"),
}
LIBRARY = ("sdpa",) + tuple(f"sdpa-{b}" for b in BACKENDS)


class AttentionError(FactError):
    """An attention workload is invalid (shape, heads, dtype, policy)."""


@dataclass(frozen=True)
class AttentionWorkload:
    """softmax(scale * q k^T [causal mask]) v over `heads` query heads sharing `kv_heads` KV heads."""

    batch: int
    heads: int
    kv_heads: int
    lq: int
    lk: int
    d: int
    dv: int
    causal: bool = False
    scale: float | None = None  # None: 1/sqrt(d), SDPA's default
    policy: str = "fp32"
    dtype: str = ""  # operand dtype; defaults from the policy
    rule: str = "attention"

    def __post_init__(self):
        if self.policy not in POLICIES:
            raise AttentionError(f"policy '{self.policy}' is not one of {', '.join(POLICIES)}")
        dims = {"batch": self.batch, "heads": self.heads, "kv_heads": self.kv_heads, "lq": self.lq, "lk": self.lk,
                "d": self.d, "dv": self.dv}
        bad = [f"{k}={v}" for k, v in dims.items() if not isinstance(v, int) or v < 1]
        if bad:
            raise AttentionError(f"attention dims must be positive integers: {', '.join(bad)}")
        if self.heads % self.kv_heads:
            raise AttentionError(f"heads={self.heads} is not a multiple of kv_heads={self.kv_heads} "
                                 "(grouped-query attention shares each KV head among heads/kv_heads query heads)")
        want = POLICY_DTYPE[self.policy]
        dtype = DTYPE_ALIASES.get(self.dtype, self.dtype) if self.dtype else want
        if dtype != want:
            raise AttentionError(f"policy {self.policy} runs {want} attention, not {dtype}")
        object.__setattr__(self, "dtype", dtype)

    @property
    def softmax_scale(self) -> float:
        return self.scale if self.scale is not None else 1.0 / math.sqrt(self.d)

    @property
    def shape(self) -> str:
        kv = f"/{self.kv_heads}kv" if self.kv_heads != self.heads else ""
        return (f"{self.batch}x{self.heads}{kv} heads, {self.lq}x{self.lk}, d={self.d}"
                + (f"/{self.dv}" if self.dv != self.d else "") + (" causal" if self.causal else ""))

    @property
    def flops(self) -> float:
        """Useful FLOPs: two products, halved by a causal mask on square problems."""
        full = 2.0 * self.batch * self.heads * self.lq * self.lk * (self.d + self.dv)
        if self.causal:
            visible = sum(min(i + 1, self.lk) for i in range(self.lq)) if self.lq <= 4096 else self.lq * self.lk / 2
            full *= visible / (self.lq * self.lk)
        return full

    def key(self, arch: str, gpu: str):
        """The registry key of this workload on `arch` and `gpu` (its family: attention)."""
        from fact_db.store.keys import AttentionKey
        return AttentionKey(arch=arch, gpu=gpu, batch=self.batch, heads=self.heads, kv_heads=self.kv_heads,
                            lq=self.lq, lk=self.lk, d=self.d, dv=self.dv, causal=bool(self.causal),
                            scale=float(self.softmax_scale), dtype=self.dtype, policy=self.policy)

    def as_dict(self) -> dict:
        return asdict(self)

    def with_(self, **kw) -> AttentionWorkload:
        return replace(self, **kw)

    # ----------------------------------------------------------------------------------
    def make_inputs(self, dist: str, device="cuda", generator=None) -> dict:
        """Fresh random q, k, v: dist `rand` (all positive) or `randn` (zero-mean)."""
        import torch
        dt = getattr(torch, self.dtype)
        f = torch.rand if dist == "rand" else torch.randn

        def draw(*shape):
            return f(*shape, device=device, dtype=torch.float32, generator=generator).to(dt)
        return {"q": draw(self.batch, self.heads, self.lq, self.d),
                "k": draw(self.batch, self.kv_heads, self.lk, self.d),
                "v": draw(self.batch, self.kv_heads, self.lk, self.dv)}

    def _explicit(self, q, k, v):
        import torch
        rep = self.heads // self.kv_heads
        if rep > 1:
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
        s = (q @ k.transpose(-2, -1)) * self.softmax_scale
        if self.causal:
            keep = torch.ones(self.lq, self.lk, dtype=torch.bool, device=q.device).tril()
            s = s.masked_fill(~keep, float("-inf"))
        p = torch.softmax(s, dim=-1)
        return p @ v

    def reference(self, inputs):
        """The float64 result on the same inputs."""
        import torch
        x = {k: v.to(torch.float64) for k, v in inputs.items()}
        return self._explicit(x["q"], x["k"], x["v"])

    def eager(self, inputs, policy: str | None = None):
        """The explicit form (what a model writing matmul/softmax/matmul had) under `policy`."""
        with policy_mode(policy or self.policy):
            return self._explicit(inputs["q"], inputs["k"], inputs["v"])


def backends_for(dtype: str) -> list[str]:
    """The SDPA backends that accept `dtype` operands."""
    return [b for b, dts in BACKENDS.items() if dtype in dts]


def sdpa(q, k, v, scale: float, causal: bool, backend: str | None = None):
    """scaled_dot_product_attention, with one backend forced (None: PyTorch's own choice)."""
    import torch.nn.functional as F
    gqa = q.shape[-3] != k.shape[-3]
    kw = {"is_causal": causal, "scale": scale}
    if gqa:
        kw["enable_gqa"] = True
    if backend is None:
        return F.scaled_dot_product_attention(q, k, v, **kw)
    from torch.nn.attention import SDPBackend, sdpa_kernel
    which = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
             "cudnn": SDPBackend.CUDNN_ATTENTION, "math": SDPBackend.MATH}[backend]
    with sdpa_kernel([which]):
        return F.scaled_dot_product_attention(q, k, v, **kw)


_OPS: dict = {}


def library_op(backend: str):
    """SDPA with `backend` forced, as `torch.ops.factdb.sdpa_<backend>(q, k, v, scale, causal)`.

    A custom op, so torch.compile keeps the backend instead of re-choosing it. Its output is laid
    out [batch, lq, heads, dv] in memory (`kernel.out_strides`, as the GPU backends write it; the
    math backend's is copied), which is what the op's fake implementation promises.
    """
    if backend not in BACKENDS:
        raise AttentionError(f"unknown SDPA backend '{backend}': use one of {', '.join(BACKENDS)}")
    if backend in _OPS:
        return _OPS[backend]
    import torch
    name = f"sdpa_{backend}"
    existing = getattr(torch.ops.factdb, name, None) if hasattr(torch.ops, "factdb") else None
    if existing is None:
        @torch.library.custom_op(f"factdb::{name}", mutates_args=(),
                                 schema="(Tensor q, Tensor k, Tensor v, float scale, bool causal) -> Tensor")
        def _op(q, k, v, scale, causal):
            o = sdpa(q, k, v, scale, causal, backend)
            if o.stride() == out_strides(*o.shape):
                return o
            return empty_out(*o.shape, o.dtype, o.device).copy_(o)

        _op.register_fake(attention_fake(None))   # the kernels' fake: their layout, q's dtype
        existing = getattr(torch.ops.factdb, name)
    _OPS[backend] = existing
    return existing
