"""Every object collective in the repository's code runs on a gloo group (trainer/device_guard.py).

torch's object collectives pickle each payload into a tensor on the group's device: on NCCL every rank
stages world size x the largest payload on its GPU (a step's samples with their routes: ~4 GB per GPU on
the 30B-A3B recipe, while the engine still holds its KV cache). So each call names its group, and the
group is a gloo one: by this repository's convention a gloo group's name ends in `cpu_group`
(ParallelState.cpu_group, Processes.cpu_group / job_cpu_group / dp_cpu_group). The device guard refuses
the rest at run time in every test that runs under it (the tiny loop, the separated and MoE runs, the
foundation and GPU-check dry runs); this test reads the source, so a call the launched runs do not reach
is held to the same rule."""

import ast

from megatron_rl.trainer.device_guard import OBJECT_COLLECTIVES
from tests.helpers.launch import REPO

PLACES = ("megatron_rl", "launch", "tools", "benchmarks")


def _object_collective_calls():
    for place in PLACES:
        for path in sorted((REPO / place).rglob("*.py")):
            source = path.read_text()
            for node in ast.walk(ast.parse(source)):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                    if node.func.attr in OBJECT_COLLECTIVES:
                        yield path.relative_to(REPO), node, source


def test_every_object_collective_names_a_gloo_group():
    calls = list(_object_collective_calls())
    assert len(calls) >= 10, "the scan finds the package's object collectives"
    wrong = []
    for path, node, source in calls:
        group = next((k.value for k in node.keywords if k.arg == "group"), None)
        text = ast.get_source_segment(source, group) if group is not None else None
        if text is None or not text.endswith("cpu_group"):
            wrong.append(f"{path}:{node.lineno}: {node.func.attr}(..., group={text})")
    assert wrong == [], "object collectives not on a gloo group:\n" + "\n".join(wrong)


def test_the_guard_wraps_every_object_collective_torch_has():
    import torch.distributed as dist

    torch_has = {
        n for n in dir(dist) if n.endswith(("_object", "_object_list")) and callable(getattr(dist, n))
    }
    assert torch_has <= set(OBJECT_COLLECTIVES), torch_has - set(OBJECT_COLLECTIVES)
