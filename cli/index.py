"""`factdb index`: placeholder, filled in by its owner."""
