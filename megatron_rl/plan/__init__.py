"""Capacity planner: size a GRPO or PPO run before renting GPUs.

Pure Python (no torch): from a recipe's model, workload, cluster and assumptions it predicts tokens,
FLOPs and GPU-seconds per phase, generation bound by HBM bandwidth and the longest completion,
scoring in the CPU pool, the serial and the overlapped cycle, weight publication over each network
cut, memory per GPU, checkpoints and failures, and ranks the layouts of the GPU count.

    inputs.py       the recipe's numbers (PlanInputs); the layout is megatron_rl.parallel.layout.ParallelLayout
    models.py       the models on the trainer's GPUs (policy, reference, PPO's critic, a reward model):
                    each one's stage parameters, head and matmul parameters
    flops.py        tokens per step, training / log-prob / prefill / decode FLOPs; the critic's and the
                    reward model's
    generation.py   decode bytes per step, KV capacity, concurrency, the longest-completion floor
    scoring.py      CPU pool time and how much hides behind generation
    memory.py       trainer and engine memory per GPU, by model and by moment; memory_per_gpu(recipe)
                    for `validate`
    publication.py  weight bytes and the floor over each network cut
    reliability.py  checkpoint size and write time, Young/Daly interval, expected failures
    cycle.py        phase times on a layout, serial vs overlapped, colocated vs separated splits
    search.py       every layout of a GPU count, ranked, with the reason each rejected one fails
    calibrate.py    measured step records -> calibrated phases and "what if we separate the pools"
    report.py       the plan as typed data (report_types.py; --json via to_json()); render.py as text;
                    plot.py as a Gantt PNG
`megatron-rl plan` is megatron_rl/cli/plan.py.
"""

from megatron_rl.plan.memory import memory_per_gpu

__all__ = ["memory_per_gpu"]
