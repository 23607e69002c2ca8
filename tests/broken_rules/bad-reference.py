"""Fixture placeholder: this broken rule is only ever validated, never tested."""
