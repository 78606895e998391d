"""A second model's layout on the trainer's ranks (ParallelLayout.for_model) and the groups model_groups builds
from it: every rank in exactly one group of each kind, the groups the layout's coordinates give."""

from __future__ import annotations

import pytest

from megatron_rl.parallel.layout import ParallelLayout
from megatron_rl.trainer.model_groups import _groups_of


def test_for_model_keeps_the_ranks_and_gives_dp_the_rest():
    trainer = ParallelLayout.over(8, tp=2, pp=1, sequence_parallel=True)
    assert trainer.for_model(0, 0) is trainer and trainer.for_model(2, 1) is trainer
    own = trainer.for_model(4, 2)
    assert (own.tp, own.pp, own.dp, own.trainer_world) == (4, 2, 1, 8)
    assert own.sequence_parallel and not trainer.for_model(1, 2).sequence_parallel  # only where TP > 1
    assert trainer.for_model(1, 1).dp == 8
    with pytest.raises(ValueError, match="3 x 1 does not divide the trainer's 8 ranks"):
        trainer.for_model(3, 1)


@pytest.mark.parametrize(("tp", "pp"), [(2, 2), (4, 1), (1, 4), (1, 1)])
def test_each_kind_of_group_partitions_the_ranks_as_the_coordinates_say(tp, pp):
    layout = ParallelLayout.over(8, tp=1).for_model(tp, pp)
    for members, same in (
        (layout.tp_group, lambda c: (c.dp, c.pp)),
        (layout.pp_group, lambda c: (c.tp, c.dp)),
        (layout.dp_group, lambda c: (c.tp, c.pp)),
    ):
        groups = _groups_of(layout, members)
        assert sorted(r for g in groups for r in g) == list(range(8)), "each rank in exactly one group"
        for g in groups:
            assert len({same(layout.trainer_coord(r)) for r in g}) == 1, g
