"""A recipe resolved once into what a run is: the layout, the model's spec read from its checkpoint,
the sampling settings with the checkpoint's end ids, how publications land and engines sleep, how far
the engines may run ahead, and the agreement thresholds (resolve.py). `validate` builds it; every
consumer (the driver, the loop's builders, the planner, the commands) reads it and decides nothing
again."""

from megatron_rl.run.resolve import Run, resolve

__all__ = ["Run", "resolve"]
