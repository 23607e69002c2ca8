"""What `optimize` returns besides the module: its report (per region, the peers, the
verification) and the error it raises before it starts.

    >>> fast.report.speedup, fast.report.variant("torch.compile").ms
"""
from __future__ import annotations

from dataclasses import dataclass, field

from fact_db.core.errors import FactError


class OptimizeError(FactError):
    """optimize cannot run: no GPU, a model that does not trace or run, an unsupported policy."""


@dataclass
class Variant:
    """One way of running the model, timed end to end in the optimizing process."""

    name: str
    ms: float | None = None
    p10_ms: float | None = None
    p90_ms: float | None = None
    err: float | None = None          # against the float64 model, on the first input set
    peak_mib: float | None = None     # beyond what was allocated before the call, plus held_mib
    held_mib: float | None = None     # kept between calls beyond the model's parameters (fact-db's buffers, CUDA graph pools)
    compile_s: float | None = None    # first call (torch.compile's compile time)
    round_ms: list = field(default_factory=list)  # the median of each interleaved round (uncompiled variants)
    clocks: list = field(default_factory=list)    # the GPU's clocks after each timing (bench.gpu_clocks)
    note: str = ""

    def as_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass
class OptimizeReport:
    """What `optimize` did and measured; `report.py` renders it as markdown, JSON and a chart."""

    problem: str
    policy: str
    device: dict
    toolchain: dict
    regions: list                       # realize.Realized
    variants: list = field(default_factory=list)
    verification: object = None         # verify.ModelVerdict
    notes: list = field(default_factory=list)
    stages_s: dict = field(default_factory=dict)
    plan_only: bool = False
    llm_calls: int = 0
    choice: object = None               # choice.Choice: what optimize returns, and every candidate's figures
    fallback: str = ""                  # why optimize returned eager after discovery ("" where it did not stop)

    def variant(self, name: str) -> Variant | None:
        return next((v for v in self.variants if v.name == name), None)

    @property
    def speedup(self) -> float | None:
        """fact-db (the returned module) over eager at the same policy, same process."""
        f, e = self.variant("fact-db"), self.variant(f"eager {self.policy}")
        return e.ms / f.ms if f and e and f.ms and e.ms else None

    def as_dict(self) -> dict:
        from fact_db.composition.report import report_dict
        return report_dict(self)
