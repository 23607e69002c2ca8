"""Runs that stay in one dtype where model code reaches past its module tree: a tensor drawn
in forward without a dtype (`torch.randn(...)`, KernelBench L3-35), a module-level tensor, a
tensor a closure holds. Converting the model (recast.py) cannot reach those; a torch function
mode converts them as forward reads them.

    >>> with Float64Mode():
    ...     out = ref_model(*inputs64)            # every floating tensor an op reads is float64
    >>> policy_forward(model_bf16, torch.bfloat16, (x,))   # what forward had to have cast; [] if nothing
"""
from __future__ import annotations

import functools
import types

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten, tree_map

# Factory functions whose result takes the default dtype when no dtype is given.
FACTORIES = {"randn", "rand", "zeros", "ones", "empty", "full", "tensor", "linspace", "logspace", "arange", "eye",
             "normal", "empty_strided", "scalar_tensor"}
# Conversions that, in the float64 run, would round a float64 tensor to a narrower dtype.
DOWNCASTS = {"to", "float", "half", "bfloat16", "type", "type_as"}
# Draws that follow their input's dtype: in the float64 run they draw in float32, the dtype
# the float32 model draws in, so both runs see the same numbers.
RANDOM_LIKE = {"randn_like", "rand_like"}
RANDOM_IN_PLACE = {"normal_", "uniform_", "bernoulli_", "exponential_", "cauchy_", "log_normal_", "geometric_"}


def _name(func) -> str:
    return getattr(func, "__name__", "")


def _in_place(name: str) -> bool:
    """The first argument is written (x.add_(y), x[i] = y, x += y): it must stay the object it is."""
    return (name.endswith("_") and not name.startswith("__")) or name.startswith("__i") or name == "__setitem__"


def _map_args(args, kwargs, name, f):
    keep = args[:1] if _in_place(name) else ()
    args = (*keep, *tree_map(f, tuple(args[len(keep):])))
    kwargs = {k: (v if k == "out" else tree_map(f, v)) for k, v in kwargs.items()}
    return args, kwargs


class Float64Mode(TorchFunctionMode):
    """The float64 reference run: every floating tensor an op reads is converted to float64
    (a module-level tensor, a closure's tensor, a tensor drawn in forward with the default
    dtype, which keeps the random values the float32 model draws; `randn_like` and in-place
    draws into float64 tensors draw in float32 too), and a conversion of a float64 tensor to
    a narrower dtype (`x.float()`) keeps float64. Tensors an op writes in place are left as
    they are."""

    def __torch_function__(self, func, types_, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = _name(func)
        if name in ("__get__", "__set__"):
            return func(*args, **kwargs)

        def up(x):
            if isinstance(x, torch.Tensor) and x.is_floating_point() and x.dtype != torch.float64:
                return x.to(torch.float64)
            return x
        args, kwargs = _map_args(args, kwargs, name, up)
        src = args[0] if args else None
        if isinstance(src, torch.Tensor) and src.dtype == torch.float64:
            if name in RANDOM_LIKE and kwargs.get("dtype") is None:
                return func(*args, **{**kwargs, "dtype": torch.float32}).to(torch.float64)
            if name in RANDOM_IN_PLACE:
                return src.copy_(func(torch.empty_like(src, dtype=torch.float32), *args[1:], **kwargs))
        out = func(*args, **kwargs)
        if (name in DOWNCASTS and isinstance(src, torch.Tensor) and src.dtype == torch.float64
                and isinstance(out, torch.Tensor) and out.is_floating_point() and out.dtype != torch.float64):
            return src.to(device=out.device, copy=True)
        return out


class PolicyMode(TorchFunctionMode):
    """forward of a model at a half policy: a tensor drawn with the default dtype
    (`torch.randn(...)` with no dtype) becomes the policy's dtype, and so does a floating
    tensor of another dtype that forward reads without having made it (a module-level
    tensor, a closure's). What forward makes in another dtype on purpose (`x.float()` before
    a softmax) stays as it is. `cast` lists what was converted."""

    def __init__(self, dtype):
        super().__init__()
        self.dtype = dtype
        self.made: set[int] = set()
        self.cast: list[str] = []

    def __torch_function__(self, func, types_, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = _name(func)
        if name in ("__get__", "__set__"):
            return func(*args, **kwargs)

        def foreign(x):
            if (isinstance(x, torch.Tensor) and x.is_floating_point() and x.dtype != self.dtype
                    and id(x) not in self.made):
                self.cast.append(f"a {str(x.dtype).replace('torch.', '')} tensor of shape {tuple(x.shape)} "
                                 f"that forward did not make (read by {name})")
                return x.to(self.dtype)
            return x
        args, kwargs = _map_args(args, kwargs, name, foreign)
        out = func(*args, **kwargs)
        if (name in FACTORIES and kwargs.get("dtype") is None and isinstance(out, torch.Tensor)
                and out.is_floating_point() and out.dtype == torch.get_default_dtype() and out.dtype != self.dtype):
            out = out.to(self.dtype)
            self.cast.append(f"torch.{name} with the default dtype")
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self.made.add(id(t))
        return out


def _at_dtype(forward, dtype):
    """`forward` (the class's) run under PolicyMode: a function, bound to a model as its own
    `forward`, so a deep copy binds it to the copy and torch.export reads its code."""
    @functools.wraps(forward)
    def forward_at_dtype(self, *args, **kwargs):
        with PolicyMode(dtype):
            return forward(self, *args, **kwargs)
    return forward_at_dtype


def policy_forward(model, dtype, example_inputs) -> list[str]:
    """Run `model`'s forward once on fake copies of `example_inputs` (nothing computed) under
    PolicyMode; where it had to convert anything, make the mode part of `model.forward` (its
    ops then run in `dtype`, in eager runs and in what torch.export traces). Returns what was
    converted; [] leaves the model as it was, so eager timing pays no mode."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from fact_db.pipeline.state import ModelState
    state = ModelState(model, copies=False)
    mode = PolicyMode(dtype)
    try:
        with torch.no_grad(), FakeTensorMode(allow_non_fake_inputs=True) as fake:
            xs = tree_map(lambda x: fake.from_tensor(x) if isinstance(x, torch.Tensor) else x, tuple(example_inputs))
            with mode:
                type(model).forward(model, *xs)
    except Exception:  # noqa: BLE001  (a forward fake tensors cannot run: left as it is; tracing says why)
        return []
    finally:
        state.restore()
    if mode.cast:
        model.forward = types.MethodType(_at_dtype(type(model).forward, dtype), model)
    return sorted(set(mode.cast))
