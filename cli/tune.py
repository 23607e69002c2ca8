"""`factdb tune`: placeholder, filled in by its owner."""
