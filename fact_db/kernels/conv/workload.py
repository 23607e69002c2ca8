"""The convolution workload: one convolution (1-D, 2-D or 3-D) with its bias and the element-wise
chain after it, as one problem to realize -- with fresh inputs, a float64 reference and what
eager PyTorch (cuDNN) runs at the policy.

>>> w = ConvWorkload(n=8, c=64, k=64, input=(56, 56), filter=(3, 3), padding=(1, 1),
...                  chain='[{"op": "relu"}]', dtype="bfloat16", policy="bf16")
>>> w.output, w.flops
((56, 56), 1849688064)
>>> inp = w.make_inputs("randn", device="cpu"); y = w.reference(inp)

The chain is canonical JSON of steps as discovery records them (fact_db/discovery/conv.py),
without graph names: `{"op": "mul", "kind": "channel"}` reads the next per-channel vector
(`v0`, `v1`, ... in the inputs), `{"op": "add", "kind": "full"}` the residual `r`.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass

from fact_db.core.errors import FactError
from fact_db.core.policy import POLICIES

ELEMENT = {"float32": "float", "bfloat16": "cutlass::bfloat16_t", "float16": "cutlass::half_t"}
UNARY_OPS = ("relu", "relu6", "leaky_relu", "gelu", "gelu_tanh", "silu", "mish", "hardswish", "tanh", "sigmoid",
             "clamp")
BINARY_OPS = ("add", "sub", "mul", "div")


class ConvError(FactError):
    """A convolution workload, candidate or kernel is invalid or failed."""


def canonical_chain(steps) -> str:
    """The chain as the key holds it: steps without graph names (`node`, `tensor`), as canonical JSON."""
    keep = [{k: v for k, v in s.items() if k not in ("node", "tensor")} for s in steps]
    return json.dumps(keep, sort_keys=True, separators=(",", ":"))


def _tup(v) -> tuple:
    return tuple(int(x) for x in v)


@dataclass(frozen=True)
class ConvWorkload:
    """`y = chain(conv(x, w) + bias)`, x of shape (n, c, *input); `layout` is how x arrives:
    `nchw` (contiguous, as a model's input: the kernel's time includes its conversion) or
    `nhwc` (channels-last, from a fact-db convolution before it)."""

    n: int
    c: int
    k: int
    input: tuple
    filter: tuple
    stride: tuple = ()
    padding: tuple = ()
    dilation: tuple = ()
    output_padding: tuple = ()
    groups: int = 1
    transposed: bool = False
    bias: bool = True
    chain: str = "[]"
    dtype: str = "float32"
    policy: str = "fp32"
    layout: str = "nchw"
    rule: str = "conv"

    def __post_init__(self):
        d = len(self.input)
        fill = lambda v, x: _tup(v) if v else (x,) * d  # noqa: E731
        for name, default in (("input", None), ("filter", None), ("stride", 1), ("padding", 0), ("dilation", 1),
                              ("output_padding", 0)):
            v = getattr(self, name)
            object.__setattr__(self, name, _tup(v) if default is None else fill(v, default))
        if d not in (1, 2, 3) or any(len(getattr(self, f)) != d for f in ("filter", "stride", "padding", "dilation",
                                                                           "output_padding")):
            raise ConvError(f"conv geometry input={self.input} filter={self.filter} stride={self.stride} "
                            f"padding={self.padding} dilation={self.dilation}: one size per spatial dim (1 to 3) needed")
        if self.dtype not in ELEMENT:
            raise ConvError(f"conv dtype '{self.dtype}' is not one of {', '.join(ELEMENT)}")
        if self.policy not in POLICIES:
            raise ConvError(f"conv policy '{self.policy}' is not one of {', '.join(POLICIES)}")
        if self.layout not in ("nchw", "nhwc"):
            raise ConvError(f"conv layout '{self.layout}' is not nchw or nhwc")
        if min(self.n, self.c, self.k, self.groups) < 1 or self.c % self.groups or self.k % self.groups:
            raise ConvError(f"conv n={self.n} c={self.c} k={self.k} groups={self.groups}: positive sizes, channels "
                            "divisible by groups needed")
        for s in self.steps:
            if s.get("op") not in UNARY_OPS + BINARY_OPS:
                raise ConvError(f"conv chain step {s} is not one of {', '.join(UNARY_OPS + BINARY_OPS)}")
        if min(self.output) < 1:
            raise ConvError(f"conv output {self.output} is empty for input {self.input} and filter {self.filter}")

    # ------------------------------------------------------------------ geometry
    @property
    def spatial(self) -> int:
        return len(self.input)

    @property
    def output(self) -> tuple:
        if self.transposed:
            return tuple((i - 1) * s - 2 * p + d * (f - 1) + op + 1 for i, s, p, d, f, op in
                         zip(self.input, self.stride, self.padding, self.dilation, self.filter, self.output_padding))
        return tuple((i + 2 * p - d * (f - 1) - 1) // s + 1 for i, s, p, d, f in
                     zip(self.input, self.stride, self.padding, self.dilation, self.filter))

    @property
    def steps(self) -> list:
        return json.loads(self.chain)

    @property
    def vec_steps(self) -> list:
        """The chain's steps that read a per-channel vector (or a one-element tensor)."""
        return [s for s in self.steps if s.get("kind") in ("channel", "scalar")]

    @property
    def residual(self) -> bool:
        return any(s.get("kind") == "full" for s in self.steps)

    @property
    def flops(self) -> int:
        """2 x multiply-adds: output pixels x output channels x input channels per group x filter
        taps (a transposed conv: input pixels x input channels x output channels per group x taps)."""
        if self.transposed:
            return 2 * self.n * math.prod(self.input) * self.c * (self.k // self.groups) * math.prod(self.filter)
        return 2 * self.n * math.prod(self.output) * self.k * (self.c // self.groups) * math.prod(self.filter)

    def x_shape(self) -> tuple:
        return (self.n, self.c, *self.input)

    def w_shape(self) -> tuple:
        if self.transposed:
            return (self.c, self.k // self.groups, *self.filter)
        return (self.k, self.c // self.groups, *self.filter)

    def y_shape(self) -> tuple:
        return (self.n, self.k, *self.output)

    def key_fields(self) -> dict:
        """The registry key's fields besides arch and GPU."""
        j = lambda v: "x".join(map(str, v))  # noqa: E731
        return {"rule": self.rule, "dtype": self.dtype, "layout": self.layout, "n": self.n, "c": self.c, "k": self.k,
                "input": j(self.input), "filter": j(self.filter), "stride": j(self.stride), "padding": j(self.padding),
                "dilation": j(self.dilation), "output_padding": j(self.output_padding), "groups": self.groups,
                "transposed": self.transposed, "bias": self.bias, "chain": self.chain, "policy": self.policy}

    def key(self, arch: str, gpu: str):
        """The registry key of this workload on `arch` and `gpu` (its family: conv)."""
        from fact_db.store.keys import ConvKey
        return ConvKey(arch=arch, gpu=gpu, **self.key_fields())

    def as_dict(self) -> dict:
        d = asdict(self)
        for f in ("input", "filter", "stride", "padding", "dilation", "output_padding"):
            d[f] = list(d[f])
        return d

    def describe(self) -> str:
        steps = "+".join(s["op"] for s in self.steps)
        return (f"{'convT' if self.transposed else 'conv'}{self.spatial}d N{self.n} C{self.c} K{self.k} "
                f"{'x'.join(map(str, self.input))} f{'x'.join(map(str, self.filter))}"
                f"{' +bias' if self.bias else ''}{' +' + steps if steps else ''} {self.dtype} {self.policy}")

    # ------------------------------------------------------------------ inputs and references
    def make_inputs(self, dist: str = "randn", device: str = "cuda", generator=None) -> dict:
        """Fresh inputs: x (n, c, *input) contiguous, w, bias, v0.. (one per vector step), r (the
        residual). `rand` all-positive (KernelBench's), `randn` zero-mean. The weight is scaled
        by 1/sqrt(fan-in), so outputs stay O(1) whatever the filter's size."""
        import torch
        from fact_db.kernels.abi import torch_dtype
        dt = torch_dtype(self.dtype)
        draw = torch.rand if dist == "rand" else torch.randn
        mk = lambda *shape: draw(*shape, device=device, generator=generator)  # noqa: E731
        fan_in = (self.c // self.groups) * math.prod(self.filter)
        inp = {"x": mk(*self.x_shape()).to(dt), "w": (mk(*self.w_shape()) / math.sqrt(fan_in)).to(dt)}
        if self.bias:
            inp["bias"] = mk(self.k).to(dt)
        for i, s in enumerate(self.vec_steps):
            v = mk(self.k if s["kind"] == "channel" else 1)
            # a divisor away from zero: eager's and the kernel's rounding of x / tiny differ wildly
            inp[f"v{i}"] = (1.0 + 0.5 * v.abs() if s["op"] == "div" else v).to(dt)
        if self.residual:
            inp["r"] = mk(*self.y_shape()).to(dt)
        return inp

    def _conv(self, x, w, b):
        import torch.nn.functional as F
        d = self.spatial
        if self.transposed:
            fn = (F.conv_transpose1d, F.conv_transpose2d, F.conv_transpose3d)[d - 1]
            return fn(x, w, b, self.stride, self.padding, self.output_padding, self.groups, self.dilation)
        fn = (F.conv1d, F.conv2d, F.conv3d)[d - 1]
        return fn(x, w, b, self.stride, self.padding, self.dilation, self.groups)

    def apply_chain(self, y, inputs: dict):
        """The chain on `y`, in y's dtype, the way eager PyTorch computes it."""
        import torch
        import torch.nn.functional as F
        vi = 0
        shape = [1, self.k] + [1] * self.spatial
        for s in self.steps:
            op = s["op"]
            if op in BINARY_OPS:
                if "scalar" in s:
                    t = s["scalar"]
                elif s.get("kind") == "full":
                    t = inputs["r"].to(y.dtype)
                else:
                    t = inputs[f"v{vi}"].to(y.dtype)
                    t = t.view(shape) if t.numel() == self.k else t.view(1)
                    vi += 1
                y = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div}[op](y, t)
            elif op == "relu":
                y = torch.relu(y)
            elif op == "relu6":
                y = F.relu6(y)
            elif op == "leaky_relu":
                y = F.leaky_relu(y, s["slope"])
            elif op in ("gelu", "gelu_tanh"):
                y = F.gelu(y, approximate="tanh" if op == "gelu_tanh" else "none")
            elif op == "silu":
                y = F.silu(y)
            elif op == "mish":
                y = F.mish(y)
            elif op == "hardswish":
                y = F.hardswish(y)
            elif op == "tanh":
                y = torch.tanh(y)
            elif op == "sigmoid":
                y = torch.sigmoid(y)
            elif op == "clamp":
                y = torch.clamp(y, s.get("min"), s.get("max"))
        return y

    def reference(self, inputs: dict):
        """The float64 result (on the inputs' device)."""
        import torch
        f64 = lambda t: t.to(torch.float64) if t is not None else None  # noqa: E731
        y = self._conv(f64(inputs["x"]), f64(inputs["w"]), f64(inputs.get("bias")))
        return self.apply_chain(y, {k: f64(v) for k, v in inputs.items()})

    def eager(self, inputs: dict, policy: str | None = None):
        """What PyTorch runs at the policy: cuDNN's convolution (TF32 off under fp32 and tf32x3,
        on under tf32: core.policy.policy_mode), then the chain op by op."""
        from fact_db.core.policy import policy_mode
        with policy_mode(policy or self.policy):
            y = self._conv(inputs["x"], inputs["w"], inputs.get("bias"))
            return self.apply_chain(y, inputs)
