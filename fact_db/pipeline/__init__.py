"""The pipeline: the three stages on one model (discover, realize, compose), verified end to
end and measured against its peers; what `fact_db.optimize` and `fact_db.plan` are.

    >>> from fact_db.pipeline import optimize, plan
"""
from fact_db.pipeline.results import OptimizeError, OptimizeReport, Variant
from fact_db.pipeline.run import optimize, optimize_problem, plan, plan_problem

__all__ = ["OptimizeError", "OptimizeReport", "Variant", "optimize", "optimize_problem", "plan", "plan_problem"]
