"""The recipe: dataclass schemas of every Hydra group (schema.py), the named choices (choices.py), how a
recipe loads (load.py) and how a problem with it is reported (problem.py). The bottom layer: it
imports nothing else of the package (tests/unit/test_architecture.py)."""
