"""`python -m fact_db.cli` runs the `factdb` command."""
from .main import main

main()
