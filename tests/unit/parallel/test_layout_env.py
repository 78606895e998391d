"""Rank maps (megatron's tp-cp-dp-pp order) and the launcher bootstrap."""

import pytest

from megatron_rl.parallel.dist_env import first_host, from_env
from megatron_rl.parallel.layout import ParallelLayout, TrainerCoord


def test_trainer_rank_order_matches_megatron():
    lay = ParallelLayout(tp=2, pp=2, dp=2)
    # megatron order tp-cp-ep-dp-pp: TP fastest, then DP, then PP.
    assert lay.trainer_coord(0) == TrainerCoord(0, 0, 0, 0)
    assert lay.trainer_coord(1) == TrainerCoord(1, 0, 0, 0)
    assert lay.trainer_coord(2) == TrainerCoord(0, 0, 1, 0)
    assert lay.trainer_coord(5) == TrainerCoord(1, 0, 0, 1)
    assert lay.tp_group(5) == [4, 5] and lay.dp_group(5) == [5, 7] and lay.pp_group(5) == [1, 5]
    for r in range(lay.trainer_world):
        assert lay.trainer_rank(lay.trainer_coord(r)) == r


def test_engine_ranks_colocated_and_separated():
    co = ParallelLayout(tp=2, dp=2, engine_tp=2, engine_count=2)
    assert co.engine_ranks(1) == [2, 3] and co.world_size == 4
    sep = ParallelLayout(tp=2, dp=1, engine_tp=1, engine_count=2, placement="separated")
    assert sep.engine_ranks(0) == [2] and sep.world_size == 4 and sep.engine_coord(3).engine == 1
    with pytest.raises(ValueError):
        co.engine_ranks(2)


def test_pp_stage_layers_even_and_uneven():
    assert list(ParallelLayout(pp=2).stage_range(8, 1)) == [4, 5, 6, 7]
    assert list(ParallelLayout(pp=2, pp_layers=(3, 4)).stage_range(7, 1)) == [3, 4, 5, 6]
    assert ParallelLayout(pp=3).stage_layers(8) == [3, 2, 3]  # megatron-core's uneven split; no layer lost


def test_slurm_and_torchrun_map_to_the_same_ranks():
    torchrun = {
        "RANK": "5",
        "WORLD_SIZE": "8",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "4",
        "MASTER_ADDR": "gpu003",
        "MASTER_PORT": "29500",
    }
    slurm = {
        "SLURM_PROCID": "5",
        "SLURM_NTASKS": "8",
        "SLURM_LOCALID": "1",
        "SLURM_NNODES": "2",
        "SLURM_NTASKS_PER_NODE": "4(x2)",
        "SLURM_JOB_NODELIST": "gpu[003-004]",
        "MASTER_PORT": "29500",
    }
    a, b = from_env(torchrun), from_env(slurm)
    assert (a.rank, a.world_size, a.local_rank, a.local_world_size, a.master_addr, a.master_port) == (
        b.rank,
        b.world_size,
        b.local_rank,
        b.local_world_size,
        b.master_addr,
        b.master_port,
    )
    assert a.node_rank == b.node_rank == 1


def test_nodelist_parsing():
    assert first_host("gpu[003-005,010],cpu1") == "gpu003"
    assert first_host("node7") == "node7"
    assert first_host("a-b[1,2]") == "a-b1"
