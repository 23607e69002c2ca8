"""Workload: one GEMM-family problem to realize -- shape, operand layouts, epilogue and
precision policy -- with what it takes to check and time it: fresh random inputs, the
float64 reference, and the eager PyTorch implementation under the same policy.

>>> w = GemmWorkload(m=4096, n=4096, k=4096, policy="tf32")
>>> inputs = w.make_inputs("randn", device="cuda")
>>> w.eager(inputs), w.reference(inputs)
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass, replace

from fact_db.core.errors import FactError
from fact_db.store.keys import GemmKey
from fact_db.core.policy import DTYPE_ALIASES, ELEMENT_BYTES, POLICIES, POLICY_DTYPE, policy_mode

EPILOGUES = ("none", "bias", "bias_relu", "bias_gelu", "bias_gelu_tanh", "bias_silu", "residual")


class WorkloadError(FactError):
    """A workload's shape, dtype, layout, epilogue or policy is invalid."""


def parse_shape(text: str) -> tuple[int, int, int, int]:
    """`MxNxK` or `MxNxKxB` -> (M, N, K, batch)."""
    m = re.fullmatch(r"\s*(\d+)\s*[xX]\s*(\d+)\s*[xX]\s*(\d+)\s*(?:[xX]\s*(\d+)\s*)?", text or "")
    if not m:
        raise WorkloadError(f"shape '{text}' is not MxNxK or MxNxKxB (e.g. 4096x4096x4096, or 512x2048x1024x128 "
                            "for a batch of 128)")
    dims = [int(g) if g else 1 for g in m.groups()]
    if min(dims) < 1:
        raise WorkloadError(f"shape '{text}': every dimension must be at least 1")
    return tuple(dims)  # type: ignore[return-value]


@dataclass(frozen=True)
class GemmWorkload:
    """D = epilogue(A @ B): A is M x K, B is K x N (per batch), in the policy's operand dtype.

    layout_b `col` means B is held as N x K row-major (a Linear weight, `x @ w.T`).
    `bias` epilogues add a length-N vector (bias_axis col) or length-M (row); `residual`
    adds a bias and a full M x N tensor C.
    """

    m: int
    n: int
    k: int
    batch: int = 1
    policy: str = "fp32"
    layout_a: str = "row"
    layout_b: str = "row"
    epilogue: str = "none"
    bias_axis: str = "col"
    rule: str = "gemm"
    dtype: str = ""  # operand dtype; defaults from the policy

    def __post_init__(self):
        if self.policy not in POLICIES:
            raise WorkloadError(f"policy '{self.policy}' is not one of {', '.join(POLICIES)}")
        if self.epilogue not in EPILOGUES:
            raise WorkloadError(f"epilogue '{self.epilogue}' is not one of {', '.join(EPILOGUES)}")
        for name in ("layout_a", "layout_b"):
            if getattr(self, name) not in ("row", "col"):
                raise WorkloadError(f"{name} must be row or col, got '{getattr(self, name)}'")
        if self.bias_axis not in ("row", "col"):
            raise WorkloadError(f"bias_axis must be row or col, got '{self.bias_axis}'")
        if min(self.m, self.n, self.k, self.batch) < 1:
            raise WorkloadError(f"shape {self.m}x{self.n}x{self.k}x{self.batch}: every dimension must be at least 1")
        want = POLICY_DTYPE[self.policy]
        dtype = DTYPE_ALIASES.get(self.dtype, self.dtype) if self.dtype else want
        if dtype not in ELEMENT_BYTES:
            raise WorkloadError(f"dtype '{self.dtype}' is not supported: use float32, float16 or bfloat16")
        if dtype != want:
            raise WorkloadError(f"policy {self.policy} runs {want} operands, not {dtype}: pick --policy "
                                f"{ {'float32': 'fp32, tf32 or tf32x3', 'bfloat16': 'bf16', 'float16': 'fp16'}[dtype] }")
        object.__setattr__(self, "dtype", dtype)

    # ----------------------------------------------------------------------------------
    @property
    def shape(self) -> str:
        return f"{self.m}x{self.n}x{self.k}" + (f"x{self.batch}" if self.batch > 1 else "")

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.n * self.k * self.batch

    @property
    def min_bytes(self) -> float:
        e = ELEMENT_BYTES[self.dtype]
        b = self.batch
        n_out = self.m * self.n * b
        extra = n_out if self.epilogue == "residual" else 0
        return e * (self.m * self.k * b + self.k * self.n * b + n_out + extra)

    def as_dict(self) -> dict:
        return asdict(self)

    def with_(self, **kw) -> GemmWorkload:
        return replace(self, **kw)

    def key(self, arch: str, gpu: str):
        return GemmKey(rule=self.rule, arch=arch, gpu=gpu, dtype_in=self.dtype, dtype_acc="float32",
                         dtype_out=self.dtype, layout_a=self.layout_a, layout_b=self.layout_b,
                         m=self.m, n=self.n, k=self.k, batch=self.batch, epilogue=self.epilogue,
                         policy=self.policy)

    def alignment_ok(self) -> tuple[bool, str]:
        """Whether TMA's 16-byte rule holds for every contiguous extent (else a padded/eager path)."""
        e = ELEMENT_BYTES[self.dtype]
        align = 16 // e
        need = {"K": self.k}  # K-major A (row) and K-major B (col)
        if self.layout_a == "col":
            need["M"] = self.m
        if self.layout_b == "row":
            need["N (B row-major)"] = self.n
        need["N (output)"] = self.n
        bad = [f"{name}={v}" for name, v in need.items() if v % align]
        if bad:
            return False, (f"{', '.join(bad)} not a multiple of {align} ({self.dtype} needs 16-byte aligned rows "
                           "for the TMA kernels)")
        return True, ""

    # ----------------------------------------------------------------------------------
    def make_inputs(self, dist: str, device="cuda", generator=None) -> dict:
        """Fresh random inputs: dist `rand` (all positive, KernelBench's) or `randn` (zero-mean)."""
        import torch
        dt = getattr(torch, self.dtype)

        def draw(*shape):
            f = torch.rand if dist == "rand" else torch.randn
            return f(*shape, device=device, dtype=torch.float32, generator=generator).to(dt)

        lead = (self.batch,) if self.batch > 1 else ()
        a = draw(*lead, self.m, self.k) if self.layout_a == "row" else draw(*lead, self.k, self.m).transpose(-1, -2)
        b = draw(*lead, self.k, self.n) if self.layout_b == "row" else draw(*lead, self.n, self.k).transpose(-1, -2)
        out = {"a": a, "b": b}
        if self.epilogue != "none":
            out["bias"] = draw(self.n if self.bias_axis == "col" else self.m)
        if self.epilogue == "residual":
            out["c"] = draw(*lead, self.m, self.n)
        return out

    def _activation(self):
        """The epilogue's activation (identity for `bias`); None for `none` and `residual`."""
        return activation(self.epilogue)

    def _apply(self, y, inputs):
        if self.epilogue == "none":
            return y
        bias = inputs["bias"]
        y = y + (bias if self.bias_axis == "col" else bias[:, None])
        if self.epilogue == "residual":
            return y + inputs["c"]
        return self._activation()(y)

    def reference(self, inputs):
        """The float64 result of the same computation on the same inputs."""
        import torch
        x = {k: v.to(torch.float64) for k, v in inputs.items()}
        return self._apply(torch.matmul(x["a"], x["b"]), x)

    def eager(self, inputs, policy: str | None = None):
        """What the user had: PyTorch eager under `policy` (default: this workload's)."""
        import torch
        with policy_mode(policy or self.policy):
            a, b = inputs["a"], inputs["b"]
            act = self._activation()
            if act is not None and self.bias_axis == "col" and a.dim() == 2:
                return act(torch.addmm(inputs["bias"], a, b))  # nn.Linear's path: cuBLAS adds the bias
            return self._apply(torch.matmul(a, b), inputs)


def activation(epilogue: str):
    """A GEMM epilogue's activation as one PyTorch op (identity for `bias`); None for `none`
    and `residual`. What the tuner's eager candidate applies, and the library path too
    (kernel.library_gemm_op)."""
    import torch.nn.functional as F
    return {"bias": lambda t: t, "bias_relu": F.relu, "bias_gelu": F.gelu,
            "bias_gelu_tanh": lambda t: F.gelu(t, approximate="tanh"), "bias_silu": F.silu}.get(epilogue)
