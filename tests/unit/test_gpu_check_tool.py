"""tools/gpu_check.py's arguments: the report goes under the repository's outputs/ (ignored by git) unless
--out says where, never into whatever directory the check was started from. The checks themselves run in
the CPU dry run (tests/dist/trainer/test_gpu_check_cpu.py) and on CUDA (tests/gpu/test_gpu_check.py)."""

from pathlib import Path

from tests.helpers.launch import REPO


def test_the_report_goes_under_outputs_or_where_out_says():
    import tools.gpu_check as gpu_check

    default = gpu_check.parse([]).out
    assert default.parent == REPO / "outputs" and default.name.startswith("gpu_check-")
    assert default.suffix == ".json"
    assert gpu_check.parse(["--out", "elsewhere/r.json"]).out == Path("elsewhere/r.json")
