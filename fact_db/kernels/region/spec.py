"""RegionSpec: a region of the traced graph as plain data -- its external inputs in ABI order,
its ATen ops in topological order -- evaluated in float64 for the reference and at the
policy's dtype for eager, so a worker can verify a proposed kernel for it.

    >>> spec = RegionSpec.from_graph(report.graph, ["linear", "relu"], "fp32")
    >>> spec.reference(spec.make_inputs("randn"))   # float64
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

from fact_db.core.errors import FactError
from fact_db.core.policy import POLICY_DTYPE
from fact_db.kernels.region.source import ABI, C_TYPE, ENTRY


class RegionKernelError(FactError):
    """A region cannot be given to a proposed kernel (an op fact-db cannot evaluate, a non-float input)."""


def _encode(a, inside: set, names: list):
    from fact_db.discovery.trace import Node
    if isinstance(a, Node):
        if a.name not in inside and a.name not in names:
            names.append(a.name)
        return {"ref": a.name}
    if isinstance(a, (list, tuple)):
        return [_encode(x, inside, names) for x in a]
    if a is None or isinstance(a, (bool, int, float, str)):
        return a
    raise RegionKernelError(f"argument {a!r} ({type(a).__name__}) cannot be written down for a worker")


@dataclass
class RegionSpec:
    """A region of the traced graph as plain data: its external tensor inputs (in ABI order),
    its ATen ops in topological order (args in schema order, tensors as {"ref": name}), the
    output node, and the dtype every floating tensor has at `policy`."""

    inputs: list            # [{"name", "kind", "shape", "dtype"}]
    ops: list               # [{"name", "op", "overload", "args", "arg_names"}]
    output: str
    out_shape: list
    policy: str
    dtype: str
    nodes: list = field(default_factory=list)

    # -- construction ----------------------------------------------------------------------
    @classmethod
    def from_graph(cls, graph, names: list, policy: str) -> RegionSpec:
        """The region of `graph` made of the call nodes `names` (its output: the last of them in
        graph order). Refused (RegionKernelError) when an op is not ATen, an inner value is read
        outside the region, or an input is not floating point."""
        if policy not in POLICY_DTYPE:
            raise RegionKernelError(f"policy {policy!r} is not one of {', '.join(POLICY_DTYPE)}")
        order = {n.name: i for i, n in enumerate(graph.nodes)}
        missing = [x for x in names if x not in order]
        if missing:
            raise RegionKernelError(f"region nodes {missing} are not in the graph")
        nodes = sorted({graph[x] for x in names}, key=lambda n: order[n.name])
        inside = {n.name for n in nodes}
        out = nodes[-1]
        ops, ext = [], []
        for n in nodes:
            if not n.op.startswith("aten."):
                raise RegionKernelError(f"node {n.name} is {n.op}, not an ATen op a worker can evaluate")
            if n is not out and any(u.name not in inside for u in n.users):
                raise RegionKernelError(f"node {n.name} is also read outside the region "
                                        f"({', '.join(u.name for u in n.users if u.name not in inside)})")
            ops.append({"name": n.name, "op": n.op, "overload": n.overload or "default",
                        "args": _encode(n.args, inside, ext), "arg_names": list(n.arg_names)})
        inputs = []
        for x in ext:
            nd = graph[x]
            if nd.shape is None or nd.dtype not in ("float32", "float16", "bfloat16", "float64"):
                raise RegionKernelError(f"region input {x} is {nd.dtype or 'not a tensor'}; a region kernel takes "
                                        "floating-point tensors only")
            inputs.append({"name": x, "kind": nd.op, "shape": list(nd.shape), "dtype": POLICY_DTYPE[policy]})
        if out.shape is None:
            raise RegionKernelError(f"region output {out.name} has no tensor shape")
        return cls(inputs, ops, out.name, list(out.shape), policy, POLICY_DTYPE[policy], [n.name for n in nodes])

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> RegionSpec:
        return cls(**d)

    def key(self, arch: str, gpu: str):
        """The registry key: the ops with their constant arguments, the input and output shapes,
        dtype, policy, arch and GPU (node names do not count: the same region elsewhere is the
        same key)."""
        from fact_db.store.keys import RegionKey
        return RegionKey.of(self.as_dict(), arch, gpu)

    def digest(self, arch: str, gpu: str) -> str:
        return self.key(arch, gpu).digest()

    def summary(self) -> str:
        return " -> ".join(o["op"] for o in self.ops)

    def contract(self) -> dict:
        """What the prompt tells the model about the kernel it may write for this region."""
        return {"abi": ABI, "entry": ENTRY, "element_type": C_TYPE[self.dtype],
                "inputs": [{"index": i, "name": x["name"], "kind": x["kind"], "shape": x["shape"]}
                           for i, x in enumerate(self.inputs)],
                "output": {"name": self.output, "shape": self.out_shape, "layout": "contiguous row-major"},
                "computes": [f"{o['name']} = {o['op']}.{o['overload']}({_show_args(o)})" for o in self.ops],
                "includes": "only <...> of CUDA and C++ standard headers, cutlass/..., cute/...; no file, process "
                            "or network calls; no code that runs at load time",
                "arch": "compiled with nvcc -std=c++17 -O3 -DNDEBUG for sm_90a (CUTLASS and CuTe on the include path)"}

    # -- the verify.verify() workload protocol ---------------------------------------------
    def make_inputs(self, dist: str = "randn", device="cuda", generator=None) -> dict:
        import torch
        dt = getattr(torch, self.dtype)
        draw = torch.randn if dist == "randn" else torch.rand
        return {x["name"]: draw(*x["shape"], generator=generator, device=device, dtype=torch.float32).to(dt)
                for x in self.inputs}

    def _evaluate(self, env: dict):
        import torch
        for o in self.ops:
            op = getattr(getattr(torch.ops.aten, o["op"].split(".", 1)[1]), o["overload"])
            schema = op._schema.arguments
            pos, kw = [], {}
            for i, a in enumerate(o["args"]):
                v = _decode(a, env, schema[i] if i < len(schema) else None)
                if i < len(schema) and schema[i].kwarg_only:
                    kw[schema[i].name] = v
                else:
                    pos.append(v)
            env[o["name"]] = op(*pos, **kw)
        return env[self.output]

    def reference(self, inputs: dict):
        """The region in float64 on the same inputs."""
        import torch
        with torch.autocast("cuda", enabled=False), torch.autocast("cpu", enabled=False):
            return self._evaluate({k: v.to(torch.float64) for k, v in inputs.items()})

    def eager(self, inputs: dict, policy: str | None = None):
        """The region in eager PyTorch at the policy (tf32 on for tf32 and tf32x3's baseline)."""
        import torch
        pol = policy or self.policy
        old = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = pol in ("tf32",)
        try:
            return self._evaluate(dict(inputs)).to(getattr(torch, self.dtype))
        finally:
            torch.backends.cuda.matmul.allow_tf32 = old


def _decode(a, env, arg_schema):
    import torch
    if isinstance(a, dict) and "ref" in a:
        return env[a["ref"]]
    if isinstance(a, list):
        return [_decode(x, env, None) for x in a]
    if isinstance(a, str) and arg_schema is not None and "ScalarType" in str(arg_schema.type):
        return getattr(torch, a)
    if isinstance(a, str) and arg_schema is not None and "Device" in str(arg_schema.type):
        return torch.device(a)
    return a


def _show_args(o) -> str:
    def show(a):
        if isinstance(a, dict) and "ref" in a:
            return a["ref"]
        if isinstance(a, list):
            return "[" + ", ".join(show(x) for x in a) + "]"
        return repr(a)
    return ", ".join(f"{n}={show(a)}" for n, a in zip(o["arg_names"], o["args"]))
