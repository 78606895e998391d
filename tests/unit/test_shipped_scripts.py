"""Nothing shipped rots unseen: every script in benchmarks/ and tools/ is run by a test of the suite, in a
smoke mode (tiny sizes, one repeat), so a refactor that breaks one fails `make test`. This file is the
list: a new script fails here until a test runs it."""

from pathlib import Path

from tests.helpers.launch import REPO

# script -> the test file that runs it (as a user would: its command line, its exit code, its output)
SMOKE = {
    "benchmarks/agreement.py": "tests/integration/test_script_smoke.py",
    "benchmarks/async.py": "tests/integration/test_script_smoke.py",
    "benchmarks/checkpoint.py": "tests/dist/test_script_smoke.py",
    "benchmarks/peer_trl.py": "tests/integration/test_script_smoke.py",
    "benchmarks/reshard.py": "tests/dist/test_script_smoke.py",
    "benchmarks/reward_fleet.py": "tests/integration/reward/test_reward_fleet.py",
    "benchmarks/recovery.py": "tests/integration/test_script_smoke.py",
    "benchmarks/rollout.py": "tests/integration/test_script_smoke.py",
    "benchmarks/routing_replay.py": "tests/integration/rollout/test_routing_replay.py",
    "benchmarks/sandbox.py": "tests/integration/test_script_smoke.py",
    "tools/check_logprobs.py": "tests/integration/test_script_smoke.py",
    "tools/check_prereqs.sh": "tests/integration/setup/test_make_prereqs.py",  # through `make prereqs`
    "tools/export_hf.py": "tests/integration/loop/test_hf_path.py",
    "tools/gpu_check.py": "tests/dist/trainer/test_gpu_check_cpu.py",  # --device cpu; CUDA: tests/gpu
    "tools/install_container.py": "tests/integration/setup/test_container_install.py",
    "tools/setup_system.sh": "tests/integration/setup/test_make_prereqs.py",
    "tools/slurm_local.sh": "tests/integration/slurm/conftest.py",  # the Slurm tier's session cluster
}


def _shipped() -> set[str]:
    return {
        p.relative_to(REPO).as_posix()
        for folder in ("benchmarks", "tools")
        for p in (REPO / folder).iterdir()
        if p.is_file() and p.suffix in (".py", ".sh")
    }


def test_every_script_in_benchmarks_and_tools_has_a_smoke_test():
    shipped = _shipped()
    assert shipped - set(SMOKE) == set(), "give each new script a smoke test and list it in SMOKE"
    assert set(SMOKE) - shipped == set(), "SMOKE lists a script that is gone"


def test_each_listed_test_names_its_script():
    for script, test in SMOKE.items():
        path = REPO / test
        assert path.is_file(), test
        assert Path(script).name in path.read_text(), f"{test} does not name {script}"
