"""fact-db: turn a PyTorch module into a faster one made of tuned CUTLASS kernels.

>>> import fact_db
>>> report = fact_db.discover(model, (x,))          # what would be built, and why
>>> for r in report.regions: print(r.rule, r.shape, r.estimate.gain_s)
"""
from importlib.metadata import PackageNotFoundError, version as _version

try:
    __version__ = _version("fact-db")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.0.0"

__all__ = ["discover", "__version__"]


def __getattr__(name):
    """`fact_db.discover(module, example_inputs)`, imported on first use, so that `import fact_db`
    (and commands that need no tracing, such as `factdb query` and `factdb registry`) do not
    pay for importing torch. The module `fact_db.discover` is itself callable as its
    `discover()` function, so the name means the same whichever was imported first."""
    if name == "discover":
        import importlib
        return importlib.import_module(".discover", __name__)
    raise AttributeError(f"module 'fact_db' has no attribute '{name}'")
