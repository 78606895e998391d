"""A problem found in a recipe, and the error that lists them.

The lowest layer of the package (no imports of our own): the layout, the sampling convention, the
recipe check and the planner all report in these terms, so a user meets one format everywhere:
`key=value: what is wrong and how to fix it`.
"""

from __future__ import annotations

from dataclasses import dataclass

# What kind of problem, so each command refuses what concerns it:
# - recipe: the recipe cannot describe a run (every command refuses it, the planner included);
# - driver: a valid design the training driver cannot run yet (the planner still models it);
# - memory: the planner's prediction does not fit (the planner shows the breakdown instead);
# - files: a path the recipe names cannot be read here (checkpoint, data);
# - unknown: a value read from such a path (the model's shape from its checkpoint), so whatever needs
#   it (the planner, the layout rules) cannot run here.
KINDS = ("recipe", "driver", "memory", "files", "unknown")


@dataclass(frozen=True)
class Problem:
    key: str
    value: object
    message: str  # what is wrong and how to fix it
    kind: str = "recipe"

    def __str__(self) -> str:
        return f"{self.key}={self.value!r}: {self.message}"


class ConfigError(ValueError):
    """A recipe that cannot run; lists every problem found."""

    def __init__(self, problems: list[Problem], recipe: str = ""):
        self.problems = problems
        head = f"recipe {recipe!r} is invalid" if recipe else "invalid recipe"
        super().__init__(head + ":\n" + "\n".join(f"  - {p}" for p in problems))
