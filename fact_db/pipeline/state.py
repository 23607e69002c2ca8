"""A model's state between calls, and models whose forward changes it.

Model code may change what it holds (`self.hidden = self.tanh(...)`, KernelBench L3-33;
`self.hidden.copy_(h)`); runs of such a model compare only when each starts from the same
state. ModelState records the buffers and plain tensor attributes of one or more module
trees (copies of their values, and which object each name holds) and the parameters'
identities and versions, says what a run changed, and puts the state back.

    >>> state = ModelState(model)
    >>> model(x); state.changed()          # ['hidden']
    >>> state.restore()                    # as before the call
"""
from __future__ import annotations

from fact_db.core.errors import FactError


class StateError(FactError):
    """A model changed state that cannot be put back (a parameter written in place)."""


class ModelState:
    """The state of the module trees `modules` as they are now (see module docstring).
    `copies=False` keeps no copies of values: `restore` then puts back which object each
    name holds, not what a tensor changed in place held."""

    def __init__(self, *modules, copies: bool = True):
        import torch
        self.slots = []  # (label, owner, kind, attribute, object, version, copy)
        seen = set()
        for root in modules:
            if root is None:
                continue
            for prefix, mod in root.named_modules(remove_duplicate=False):
                if id(mod) in seen:
                    continue
                seen.add(id(mod))
                for kind, table in (("param", mod._parameters), ("buffer", mod._buffers)):
                    for name, t in table.items():
                        if t is not None:
                            self._add(prefix, mod, kind, name, t, copies and kind == "buffer"
                                      and not name.startswith("_factdb_"))
                for name, v in vars(mod).items():
                    if isinstance(v, torch.Tensor) and not isinstance(v, torch.nn.Parameter):
                        self._add(prefix, mod, "plain", name, v, copies)

    def _add(self, prefix, mod, kind, name, t, copy: bool):
        label = f"{prefix}.{name}" if prefix else name
        self.slots.append((label, mod, kind, name, t, t._version, t.detach().clone() if copy else None))

    @staticmethod
    def _now(mod, kind, name):
        if kind == "param":
            return mod._parameters.get(name)
        if kind == "buffer":
            return mod._buffers.get(name)
        return vars(mod).get(name)

    @staticmethod
    def _written(t, version, saved) -> bool:
        """Whether `t` was written since it was recorded: its version counter moved, or (where a
        copy was kept) its values differ, as after a write through an alias with a counter of its
        own (an exported program's module writes BatchNorm's running statistics so)."""
        import torch
        if t._version != version:
            return True
        return saved is not None and not torch.equal(t, saved)

    def changed(self) -> list[str]:
        """The names whose object or values a run changed since this state was recorded."""
        out, seen = [], set()
        for label, mod, kind, name, t, version, saved in self.slots:
            if (self._now(mod, kind, name) is not t or self._written(t, version, saved)) and id(t) not in seen:
                seen.add(id(t))  # one tensor held in two places (an exported program's constant) is said once
                out.append(label if kind != "param" else f"{label} (a parameter)")
        return out

    def restore(self) -> None:
        """Put every recorded name back to its object and its values; StateError where a
        parameter was written in place (there is no copy of it to put back)."""
        import torch
        with torch.no_grad():
            for i, (label, mod, kind, name, t, version, saved) in enumerate(self.slots):
                if self._now(mod, kind, name) is not t:
                    if kind == "plain":
                        object.__setattr__(mod, name, t)
                    else:
                        getattr(mod, "_parameters" if kind == "param" else "_buffers")[name] = t
                if self._written(t, version, saved):
                    if saved is None and kind == "param":
                        raise StateError(f"forward writes parameter `{label}` in place, so two runs of the model "
                                         "never start from the same state")
                    if saved is not None:
                        t.copy_(saved)
                        self.slots[i] = (label, mod, kind, name, t, t._version, saved)

    def fresh(self, fn):
        """`fn` run from this state: restored before each call."""
        def run(*args, **kwargs):
            self.restore()
            return fn(*args, **kwargs)
        return run
