"""Environments for multi-turn rollouts: the model writes a turn, the environment answers.

An `Environment` (types.py) starts an `Episode` per trajectory; each model turn goes to the episode's
`step`, which returns an observation, a reward and whether the trajectory is done. Shipped:
`code_feedback` (run the turn's code against the problem's tests in the sandbox, answer with what
failed), `expression_feedback` (the tiny task's: what the expression evaluated to, and what the test
expected) and `tool_calls` (`<tool_call>` JSON in the Qwen/Hermes format, a Python tool run in the
sandbox). A recipe names one by name or as `module:Class` (`rollout.env`: resolve.py).

The turn scheduling lives in rollout/turns.py: environments know nothing of engines or tokens beyond
their own text; the scheduler appends their observations as tokens (render.py) without re-encoding
anything the engine produced.
"""
