"""fact-db: turn a PyTorch module into a faster one made of tuned CUTLASS kernels.

>>> import fact_db
>>> report = fact_db.discover(model, (x,))          # what would be built, and why
>>> for r in report.regions: print(r.rule, r.shape, r.estimate.gain_s)
>>> fast = fact_db.optimize(model, (x,), policy="fp32")   # a faster model (needs an H100/H200)
>>> fast.report.speedup, fast.artifact
>>> fast = fact_db.load(fast.artifact)               # again, tuning nothing
"""
__all__ = ["discover", "optimize", "load", "plan", "__version__"]


_PUBLIC = {"discover": "fact_db.discovery.discover", "optimize": "fact_db.pipeline", "plan": "fact_db.pipeline",
           "load": "fact_db.composition.artifact"}


def __getattr__(name):
    """The public functions, imported on first use, so that `import fact_db` (and commands
    that need no tracing, such as `factdb query` and `factdb registry`) do not pay for
    importing torch; `__version__` too, so that they do not pay for importlib.metadata.
    No module of this package shares a name with them: `fact_db.optimize` is the function
    however often it is read, and whatever was imported before."""
    import importlib
    if name == "__version__":  # looked up on first use: importlib.metadata costs every command 25 ms
        from importlib.metadata import PackageNotFoundError, version
        try:
            v = version("fact-db")
        except PackageNotFoundError:  # running from a source tree that is not installed
            v = "0.0.0"
        globals()["__version__"] = v
        return v
    if name in _PUBLIC:
        fn = getattr(importlib.import_module(_PUBLIC[name]), name)
        globals()[name] = fn
        return fn
    raise AttributeError(f"module 'fact_db' has no attribute '{name}'")
