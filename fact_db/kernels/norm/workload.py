"""The norm workload: LayerNorm or RMSNorm over the last dimension, with the residual add
before it fused in, as one problem to realize -- with its float64 reference and what eager
PyTorch runs unfused.

>>> w = NormWorkload("layernorm", rows=128 * 512, width=768, residual=True, write_sum=True,
...                  dtype="float32", policy="fp32")
>>> x = w.make_inputs("randn"); y, s = w.reference(x)
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from fact_db.core.errors import FactError
from fact_db.kernels.abi import torch_dtype

TEMPLATE = "add_norm"
ELEMENT = {"float32": "float", "bfloat16": "__nv_bfloat16", "float16": "__half"}
KINDS = ("layernorm", "rmsnorm")
# bf16/fp16 policies also need KernelBench's tolerance; fp32: the norm stays in fp32 arithmetic.
ABS_TOL = {"bfloat16": 1e-2, "float16": 1e-2}
TOLERANCE_FACTOR = 4.0
ERR_FLOOR = 1e-7


class NormError(FactError):
    """A norm workload, candidate or kernel is invalid or failed."""


@dataclass(frozen=True)
class NormWorkload:
    """`y = norm(x + r)` over the last dim of [rows, width]; `s = x + r` returned too when write_sum."""

    kind: str                 # layernorm | rmsnorm
    rows: int
    width: int
    residual: bool = False
    write_sum: bool = False
    eps: float = 1e-5
    dtype: str = "float32"
    policy: str = "fp32"
    has_bias: bool = True     # layernorm only (nn.LayerNorm(bias=False) has none)

    def __post_init__(self):
        if self.kind not in KINDS:
            raise NormError(f"norm kind '{self.kind}' is not one of {', '.join(KINDS)}")
        if self.dtype not in ELEMENT:
            raise NormError(f"norm dtype '{self.dtype}' is not one of {', '.join(ELEMENT)}")
        if self.rows < 0 or self.width <= 0:
            raise NormError(f"norm shape rows={self.rows} width={self.width}: rows >= 0 and width > 0 needed")
        if self.write_sum and not self.residual:
            raise NormError("write_sum needs residual=True (without a residual add there is no sum to write)")

    def key_fields(self) -> dict:
        """The registry key's fields besides arch and GPU (one row per distinct key)."""
        d = asdict(self)
        d["has_bias"] = self.has_bias and self.kind == "layernorm"
        return d

    def key(self, arch: str, gpu: str):
        """The registry key of this workload on `arch` and `gpu` (its family: norm)."""
        from fact_db.store.keys import NormKey
        return NormKey(arch=arch, gpu=gpu, **self.key_fields())

    def as_dict(self) -> dict:
        return asdict(self)

    def key_string(self) -> str:
        k = self.key_fields()
        return (f"{k['kind']}:{k['rows']}x{k['width']}:res={int(k['residual'])}:sum={int(k['write_sum'])}"
                f":bias={int(k['has_bias'])}:eps={k['eps']:g}:{k['dtype']}:{k['policy']}")

    # ------------------------------------------------------------------------------------
    def make_inputs(self, dist: str = "randn", device: str = "cuda", generator=None) -> dict:
        """Fresh inputs: x, r (residual), weight, bias. `rand` all-positive, `randn` zero-mean."""
        import torch
        dt = torch_dtype(self.dtype)
        draw = torch.rand if dist == "rand" else torch.randn
        mk = lambda *shape: draw(*shape, device=device, generator=generator).to(dt)  # noqa: E731
        inp = {"x": mk(self.rows, self.width)}
        if self.residual:
            inp["r"] = mk(self.rows, self.width)
        inp["weight"] = (1.0 + 0.5 * draw(self.width, device=device, generator=generator)).to(dt)
        if self.kind == "layernorm" and self.has_bias:
            inp["bias"] = mk(self.width)
        return inp

    def reference(self, inputs: dict) -> tuple:
        """(y, s) in float64; s is the sum rounded to the dtype as eager rounds it (None without residual)."""
        import torch
        x = inputs["x"]
        s = (x + inputs["r"]) if self.residual else x  # eager's rounding of the sum is part of the function
        s64 = s.to(torch.float64)
        w = inputs["weight"].to(torch.float64)
        if self.kind == "layernorm":
            b = inputs.get("bias")
            y = torch.nn.functional.layer_norm(s64, (self.width,), w, None if b is None else b.to(torch.float64),
                                               self.eps)
        else:
            y = s64 * torch.rsqrt(s64.pow(2).mean(-1, keepdim=True) + self.eps) * w
        return y, (s64 if self.write_sum else None)

    def eager(self, inputs: dict) -> tuple:
        """What PyTorch runs unfused: `x + r` then `layer_norm` / `rms_norm`."""
        import torch
        x = inputs["x"]
        s = x + inputs["r"] if self.residual else x
        if self.kind == "layernorm":
            y = torch.nn.functional.layer_norm(s, (self.width,), inputs["weight"], inputs.get("bias"), self.eps)
        else:
            y = torch.nn.functional.rms_norm(s, (self.width,), inputs["weight"], self.eps)
        return y, (s if self.write_sum else None)
