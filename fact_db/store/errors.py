"""The registry's base error, in a module of its own so that what only reads rows (keys,
records, the lean reader) imports no database library. fact_db.store.db defines the rest
(RegistryBusy, NotARegistry, ServerUnreachable) and exports this one as before."""
from __future__ import annotations

from fact_db.core.errors import FactError


class RegistryError(FactError):
    """The registry cannot be opened or used as asked."""
