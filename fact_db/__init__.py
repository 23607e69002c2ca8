"""fact-db: turn a PyTorch module into a faster one made of tuned CUTLASS kernels.

>>> import fact_db
>>> report = fact_db.discover(model, (x,))          # what would be built, and why
>>> for r in report.regions: print(r.rule, r.shape, r.estimate.gain_s)
>>> fast = fact_db.optimize(model, (x,), policy="fp32")   # a faster model (needs an H100/H200)
>>> fast.report.speedup, fast.artifact
>>> fast = fact_db.load(fast.artifact)               # again, tuning nothing
"""
__all__ = ["discover", "optimize", "load", "plan", "__version__"]


def __getattr__(name):
    """`fact_db.discover(module, example_inputs)`, imported on first use, so that `import fact_db`
    (and commands that need no tracing, such as `factdb query` and `factdb registry`) do not
    pay for importing torch; `__version__` too, so that they do not pay for importlib.metadata.
    The module `fact_db.discover` is itself callable as its `discover()` function, so the name
    means the same whichever was imported first."""
    import importlib
    if name == "__version__":  # looked up on first use: importlib.metadata costs every command 25 ms
        from importlib.metadata import PackageNotFoundError, version
        try:
            v = version("fact-db")
        except PackageNotFoundError:  # running from a source tree that is not installed
            v = "0.0.0"
        globals()["__version__"] = v
        return v
    if name == "discover":
        return importlib.import_module(".discover", __name__)
    if name in ("optimize", "plan"):
        return getattr(importlib.import_module(".optimize", __name__), name)
    if name == "load":
        return importlib.import_module(".artifact", __name__).load
    raise AttributeError(f"module 'fact_db' has no attribute '{name}'")
