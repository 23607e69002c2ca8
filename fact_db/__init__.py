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

from .discover import discover  # noqa: E402  (the function; the module is fact_db.discover in sys.modules)

__all__ = ["discover", "__version__"]
