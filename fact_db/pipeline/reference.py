"""The reference a composed model is verified against: the model in float64, built the way its
problem builds it (recast.py), run under Float64Mode (dtype_modes.py) on the GPU where it fits
and on the CPU where it does not; or, where no float64 run works, eager at the policy, said so.

    >>> ref = build_reference(model, model_p, "fp32", (x,), build=lambda device: Model(*init))
    >>> ref.kind, ref.label, ref.notes       # "float64" / "eager", what the report names, what was done
    >>> out = ref(*for_reference(inputs, ref))
"""
from __future__ import annotations

from dataclasses import dataclass, field

from fact_db.core.errors import first_line

# The float64 model is run on the GPU only where its estimated need is at most this share of
# the GPU's free memory: verification still holds the inputs' copies and three outputs there.
HEADROOM = 0.5
# Ops that draw random numbers: a model with them compares only on one device's generator.
RANDOM_OPS = ("rand", "normal", "bernoulli", "uniform", "multinomial", "exponential", "poisson", "native_dropout")


@dataclass
class Reference:
    kind: str                 # "float64" (the model in float64) or "eager" (eager at the policy)
    label: str                # what the report names: "the float64 model", "eager fp32 (...)"
    run: object               # run(*inputs) -> output, inputs as `for_reference` gives them
    device: object = None     # where it takes its inputs (None: where they are)
    input_dtype: object = None  # the dtype of its floating inputs (None: as they are)
    model: object = None      # the float64 model, whose state verification restores
    notes: list = field(default_factory=list)

    def __call__(self, *inputs):
        return self.run(*inputs)


def draws_random(graph) -> list[str]:
    """The ops of a traced graph that draw random numbers."""
    if graph is None:
        return []
    return sorted({n.op for n in graph.calls() if n.op.split(".")[-1].startswith(RANDOM_OPS)})


def output_numel(graph) -> int:
    """Elements of the floating outputs of a traced graph (0 where unknown)."""
    if graph is None:
        return 0
    out = next((n for n in graph.nodes if n.op == "output"), None)
    from torch.utils._pytree import tree_flatten
    return sum(a.numel for a in tree_flatten(out.args if out else [])[0]
               if hasattr(a, "numel") and (a.dtype or "").startswith(("float", "bfloat")))


def float64_bytes(module, inputs, out_numel: int) -> int:
    """A float64 run's memory, roughly: the model's tensors, the inputs and twice the output."""
    import torch
    from fact_db.pipeline.recast import plain_tensors
    from torch.utils._pytree import tree_flatten
    held = [t for t in list(module.parameters()) + list(module.buffers())]
    held += [x for _, _, v in plain_tensors(module).values() for x in tree_flatten(v)[0] if isinstance(x, torch.Tensor)]
    held += [x for x in inputs if isinstance(x, torch.Tensor)]
    return 8 * (sum(t.numel() for t in held) + 2 * out_numel)


def free_bytes(device) -> int:
    """What the GPU can still give: free memory plus what torch's allocator holds unused."""
    import torch
    free, _ = torch.cuda.mem_get_info(device)
    return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)


def placement(device, need, free, random=()) -> tuple:
    """(device, note): where the float64 run goes. On a GPU that it needs more than HEADROOM of
    (`need()` and `free(device)` in bytes), the CPU, unless forward draws random numbers."""
    import torch
    if torch.device(device).type != "cuda":
        return torch.device(device), ""
    n, have = need(), free(device)
    if n <= HEADROOM * have:
        return torch.device(device), ""
    if random:
        return torch.device(device), (f"the float64 model needs about {n / 2**30:.1f} GiB and the GPU has "
                                      f"{have / 2**30:.1f} GiB free, but it stays on the GPU: forward draws random "
                                      f"numbers ({', '.join(random)}) from the GPU's generator")
    return torch.device("cpu"), (f"the float64 model needs about {n / 2**30:.1f} GiB and the GPU has "
                                 f"{have / 2**30:.1f} GiB free: it runs on the CPU")


def _device(module, inputs):
    import torch
    for t in list(module.parameters()) + list(module.buffers()) + [x for x in inputs if isinstance(x, torch.Tensor)]:
        return t.device
    return torch.device("cpu")


def _float64_run(model):
    import torch

    from fact_db.pipeline.dtype_modes import Float64Mode

    def run(*xs):
        with torch.no_grad(), Float64Mode():
            return model(*xs)
    return run


def eager_reference(model_p, policy: str, why: str, notes=()) -> Reference:
    """Eager at the policy as the reference, `why` the float64 model could not serve."""
    from fact_db.composition.module import run_at_policy
    import torch

    def run(*xs):
        with torch.no_grad():
            return run_at_policy(model_p, policy, xs)
    return Reference("eager", f"eager {policy} (the float64 model {why})", run, notes=list(notes))


def build_reference(module, model_p, policy: str, inputs, *, build=None, graph=None, free=free_bytes) -> Reference:
    """The float64 model of `module` as a Reference, or eager at `policy` (`model_p`) where it
    cannot be built or run, with the reason; never raises. `build(device)` builds the model as
    its problem does (None: a deep copy). `graph` (discovery's) gives the output size and
    whether forward draws random numbers (then the reference stays on the model's device,
    whose generator the other runs use). `free(device)` -> bytes the GPU can give."""
    import torch

    from fact_db.kernels.verify import for_reference
    from fact_db.pipeline.recast import recast
    from fact_db.pipeline.state import ModelState
    notes: list[str] = []
    random = draws_random(graph)
    place, note = placement(_device(module, inputs), lambda: float64_bytes(module, inputs, output_numel(graph)), free,
                            random)
    notes += [note] if note else []
    places = [place] + ([torch.device("cpu")] if place.type == "cuda" and not random else [])
    why = ""
    for i, where in enumerate(places):
        built = False
        try:
            made = recast(module, torch.float64, build=(lambda: build(where)) if build else None, device=where)
            built = True
            how = "built afresh as the problem builds it" if made.how == "fresh build" else "a deep copy of the model"
            ref = Reference("float64", f"the float64 model ({how}, on the {'GPU' if where.type == 'cuda' else 'CPU'})",
                            _float64_run(made.model), where, torch.float64, made.model, notes + made.notes)
            state = ModelState(made.model)
            torch.manual_seed(0)
            ref(*for_reference(inputs, ref))
            state.restore()
            return ref
        except torch.cuda.OutOfMemoryError as e:
            why = f"ran out of GPU memory ({first_line(e, 120)})"
            if i + 1 < len(places):
                notes.append(f"the float64 model {why} on the GPU: it runs on the CPU")
        except Exception as e:  # noqa: BLE001  (whatever the model's code raised: the fallback says it)
            why = f"{'raised' if built else 'could not be built:'} {first_line(e, typed=True)}"
            break
        finally:
            made = ref = None
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
    if random and place.type == "cuda":
        why += f" (it stays on the GPU: forward draws random numbers, {', '.join(random)})"
    return eager_reference(model_p, policy, why, notes)
