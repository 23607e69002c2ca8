"""A model at another dtype, built the way its problem builds it.

`model.to(dtype)` converts parameters and buffers only: a tensor kept as a plain attribute
(`self.h0 = torch.randn(...)`, KernelBench L3-35) stays as it was, and a copy's closure made
in `__init__` (`self.mlpf = lambda x: m.c_proj(m.act(m.c_fc(x)))`, L3-44) still calls the
original submodules. A recast model is a fresh build (`Model(*get_init_inputs())`, so such
closures close over the new modules) with every tensor of the original copied in, or, with
no way to build one, a deep copy whose closures are rebound to the copy's submodules; either
way every floating tensor the module tree holds is converted.

    >>> r = recast(model, torch.float64, build=lambda: Model(*get_init_inputs()))
    >>> r.model, r.how, r.notes       # the float64 model, "fresh build" or "deep copy", what was done
"""
from __future__ import annotations

import copy
import types
from contextlib import contextmanager
from dataclasses import dataclass, field

from fact_db.core.errors import first_line


@dataclass
class Recast:
    model: object
    how: str                                   # "fresh build" or "deep copy"
    notes: list = field(default_factory=list)  # what could not be done the usual way, and what was done instead


def _name(dtype) -> str:
    return str(dtype).replace("torch.", "")


def _aliases(module) -> set[int]:
    return {id(t) for t in list(module.parameters()) + list(module.buffers())}


def plain_tensors(module) -> dict[str, tuple]:
    """'sub.attr' -> (owner module, attribute, value) for every attribute of the tree that holds
    tensors outside parameters and buffers (a tensor, or a list/tuple/dict of them).
    Attributes that only alias parameters (nn.LSTM's `_flat_weights`) are not listed."""
    import torch
    from torch.utils._pytree import tree_flatten
    alias = _aliases(module)
    out = {}
    for prefix, mod in module.named_modules(remove_duplicate=True):
        for attr, v in vars(mod).items():
            if attr in ("_parameters", "_buffers", "_modules"):
                continue
            leaves = [x for x in tree_flatten(v)[0] if isinstance(x, torch.Tensor)] if not isinstance(
                v, torch.nn.Module) else []
            if leaves and not all(id(x) in alias for x in leaves):
                out[f"{prefix}.{attr}" if prefix else attr] = (mod, attr, v)
    return out


def convert(module, dtype, device=None) -> list[str]:
    """Every floating tensor `module` holds, in `dtype` (and every tensor on `device`, if
    given), in place: parameters and buffers (`module.to`), then plain tensor attributes.
    Returns the plain attributes' names."""
    import torch
    from torch.utils._pytree import tree_map
    module.to(device=device, dtype=dtype)
    alias = _aliases(module)

    def conv(x):
        if not isinstance(x, torch.Tensor) or id(x) in alias:
            return x
        return x.detach().to(device=device, dtype=dtype if x.is_floating_point() else None)
    names = []
    for name, (mod, attr, v) in plain_tensors(module).items():
        setattr(mod, attr, tree_map(conv, v))
        names.append(name)
    return names


def rebind_closures(root, memo: dict) -> list[str]:
    """In a deep copy made with `memo`, every function held as an attribute whose closure
    holds objects the copy duplicated (a submodule) is replaced by the same function closing
    over the duplicates. Returns the attributes' names."""
    import torch
    done = []
    for prefix, mod in root.named_modules(remove_duplicate=True):
        for attr, v in list(vars(mod).items()):
            if isinstance(v, types.FunctionType) and not isinstance(v, torch.nn.Module):
                new = _rebound(v, memo, set())
                if new is not v:
                    setattr(mod, attr, new)
                    done.append(f"{prefix}.{attr}" if prefix else attr)
    return done


def _rebound(fn, memo: dict, seen: set):
    if not fn.__closure__ or id(fn) in seen:
        return fn
    seen.add(id(fn))
    cells, changed = [], False
    for cell in fn.__closure__:
        try:
            v = cell.cell_contents
        except ValueError:  # an empty cell (a name assigned after the closure was made)
            cells.append(cell)
            continue
        new = memo.get(id(v), v) if id(v) != id(memo) else v
        if isinstance(v, types.FunctionType):
            new = _rebound(v, memo, seen)
        changed |= new is not v
        cells.append(types.CellType(new) if new is not v else cell)
    if not changed:
        return fn
    out = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__, tuple(cells))
    out.__kwdefaults__, out.__qualname__ = fn.__kwdefaults__, fn.__qualname__
    out.__dict__.update(fn.__dict__)
    return out


def closures(module) -> list[str]:
    """Attributes of the tree that are functions closing over one of its submodules."""
    mods = {id(m) for m in module.modules()}
    out = []
    for prefix, mod in module.named_modules(remove_duplicate=True):
        for attr, v in vars(mod).items():
            if isinstance(v, types.FunctionType) and any(_holds(c, mods) for c in v.__closure__ or ()):
                out.append(f"{prefix}.{attr}" if prefix else attr)
    return out


def _holds(cell, mods: set) -> bool:
    try:
        return id(cell.cell_contents) in mods
    except ValueError:
        return False


@contextmanager
def _default_dtype(dtype):
    import torch
    old = torch.get_default_dtype()
    if dtype in (torch.float32, torch.float64):  # the only defaults torch takes
        torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


def _tensors(module) -> dict:
    """'name' -> tensor for parameters, buffers and plain tensor attributes (the attribute's
    value, possibly a container of tensors)."""
    out = {f"param:{k}": v for k, v in module.named_parameters(remove_duplicate=False)}
    out.update({f"buffer:{k}": v for k, v in module.named_buffers(remove_duplicate=False)})
    out.update({f"plain:{k}": v for k, (_, _, v) in plain_tensors(module).items()})
    return out


def _load(fresh, module, dtype, device) -> None:
    """Every tensor of `module` into the same place of `fresh` (already in `dtype`), or
    ValueError naming the first place where the two trees differ."""
    import torch
    from torch.utils._pytree import tree_map
    src, dst = _tensors(module), _tensors(fresh)
    if src.keys() != dst.keys():
        diff = sorted(src.keys() ^ dst.keys())
        raise ValueError(f"the fresh build holds other tensors than the model ({diff[0].split(':', 1)[1]})")
    plain = plain_tensors(fresh)

    def conv(x):
        if not isinstance(x, torch.Tensor):
            return x
        return x.detach().to(device=device or x.device, dtype=dtype if x.is_floating_point() else None, copy=True)
    with torch.no_grad():
        for key, s in src.items():
            kind, name = key.split(":", 1)
            if kind == "plain":
                mod, attr, _ = plain[name]
                setattr(mod, attr, tree_map(conv, s))
                continue
            if dst[key].shape != s.shape:
                raise ValueError(f"{name} is {tuple(s.shape)} in the model and {tuple(dst[key].shape)} in the fresh "
                                 "build")
            dst[key].copy_(s)


def _seeded_memo(module, dtype, device) -> dict:
    """A deepcopy memo that already holds each tensor of `module` converted (and moved), so the
    copy is made in `dtype` on `device` without a full-size copy on the module's device."""
    import torch
    memo: dict = {}
    for t in list(module.parameters()) + list(module.buffers()):
        if id(t) not in memo:
            y = t.detach().to(device=device or t.device, dtype=dtype if t.is_floating_point() else None, copy=True)
            memo[id(t)] = torch.nn.Parameter(y, t.requires_grad) if isinstance(t, torch.nn.Parameter) else y
    return memo


def recast(module, dtype, build=None, device=None) -> Recast:
    """`module` with every floating tensor it holds in `dtype` (on `device`, default: where it
    is): a fresh build from `build()` (as its problem builds it, on `device`) with the module's
    tensors copied in, or a deep copy with its closures rebound where there is no `build` or
    the build does not match the module."""
    notes = []
    if build is not None:
        try:
            with _default_dtype(dtype):
                fresh = build()
            fresh.eval()
            convert(fresh, dtype)
            _load(fresh, module, dtype, device)
            return Recast(fresh, "fresh build", notes)
        except Exception as e:  # noqa: BLE001  (any failure of the user's constructor: the deep copy still works)
            notes.append(f"building the model afresh failed ({first_line(e, typed=True)}): its {_name(dtype)} copy is "
                         "a deep copy")
    memo = _seeded_memo(module, dtype, device)
    model = copy.deepcopy(module, memo)
    rebound = rebind_closures(model, memo)
    convert(model, dtype, device)
    if rebound:
        notes.append(f"{', '.join(rebound)} close{'s' if len(rebound) == 1 else ''} over the model's submodules and "
                     f"the model could not be built afresh (no problem file): the {_name(dtype)} copy's closures were "
                     "rebound to its own submodules")
    return Recast(model, "deep copy", notes)
