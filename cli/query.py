"""`factdb query`: placeholder, filled in by its owner."""
