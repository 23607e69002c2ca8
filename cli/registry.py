"""`factdb registry`: placeholder, filled in by its owner."""
