"""Rewards: run each completion's code against its unit tests in a sandbox, or call a cheap verifier.

- `problem.Problem`: what the grader needs of a problem (where problems come from is data/'s).
- `extract`: the program to run from a completion (fenced blocks, the bare continuation of a prompt).
- `pool.RewardPool`: the streaming API the training loop uses (submit as samples finish, collect as
  results finish), with one warm sandbox per worker.
- `sandbox`: the bubblewrap sandbox on the host side, with `memcg` (its memory cgroup); `harness`
  (the zygote, the job process and the test runner), `solution` (the solution process), `jobproc` (each
  process's namespaces, capabilities and limits), `channel`, `stdio`, `testrunner`, `seccomp`, `wire`:
  the runtime inside it. The trust model (why a program cannot forge its own test results, reach the
  network or the host's files, or outlive its job) is documented at the top of `harness.py`.
- `testplan`: how a problem's tests become pass/fail units, how their names resolve, and which shapes
  are refused at load (`testshape`); `assertsites` numbers and instruments their assertions, and
  `proof` is what a unit must prove in the runner to pass (grading fails closed).
- `verifiers`: in-process rewards (`module:function`) for trusted, cheap checks.
- `result.RewardResult`: the one record every reward comes back as.
`megatron-rl score` is megatron_rl/cli/score.py (a file of completions: cli/score_batch.py).
"""
