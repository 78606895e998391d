"""A multi-turn sample trains on what the model generated only, and its ids are checked against the engine's.

The loss mask (1 generated, 0 observation) reaches the loss through `keep`, the normaliser counts generated
tokens, the KL sum skips observations, the agreement compares generated tokens only (the observations'
engine log-probs are placeholders), and `token_exact` is False as soon as one id differs from what the engine
reported it ran (a re-encoded turn, a dropped separator) or the engine's record is missing."""

from __future__ import annotations

import pytest
import torch

from megatron_rl.config.schema import AlgorithmConfig
from megatron_rl.loop.step.rl_batch import global_normaliser, kl_sums, minibatch_extras, tokens_exact
from megatron_rl.rollout.logprob_check import compare
from megatron_rl.rollout.types import Sample, token_digest, token_exact

PROMPT = [1, 4, 5]
TURN1, OBS, TURN2 = [7, 8, 2], [9, 10, 11], [12, 2]


def _trajectory() -> Sample:
    tokens = TURN1 + OBS + TURN2
    spans = [
        (len(TURN1), token_digest(PROMPT + TURN1)),
        (len(tokens), token_digest(PROMPT + tokens)),
    ]
    return Sample(
        0, 0, list(PROMPT), tokens, [-0.5, -0.4, -0.3, 0.0, 0.0, 0.0, -0.2, -0.1], "stop", False, 1,
        reward=1.0, status="passed", loss_mask=[1, 1, 1, 0, 0, 0, 1, 1], turns=2, engine_spans=spans,
    )  # fmt: skip


def test_the_loss_covers_generated_tokens_and_the_normaliser_counts_them():
    s = _trajectory()
    extras = minibatch_extras([s], [0], torch.tensor([0.7]), [1.0], {}, {})
    assert extras["keep"][0].tolist() == [1, 1, 1, 0, 0, 0, 1, 1]
    assert global_normaliser([s], [0], [1.0], "token-mean") == 5.0
    assert (s.generated_tokens, s.observation_tokens) == (5, 3)


def test_the_kl_sum_skips_observations():
    s = _trajectory()
    old = {0: torch.zeros(8)}
    ref = {
        0: torch.tensor([0.0, 0.0, 0.0, 5.0, 5.0, 5.0, 0.0, 0.0])
    }  # the reference differs on observations only
    assert kl_sums(old, ref, "k1", samples=[s]) == {0: 0.0}
    assert kl_sums(old, ref, "k1")[0] != 0.0  # without the masks it would not


def test_the_agreement_compares_generated_tokens_only():
    s = _trajectory()
    trainer = torch.tensor([-0.5, -0.4, -0.3, -3.0, -2.0, -1.0, -0.2, -0.1])  # observations: any value
    out = compare([s], [trainer], threshold=1e-6)
    assert out["tokens"] == 5 and out["max_abs_diff"] < 1e-7 and out["beyond_threshold"] == []


def test_token_exact_holds_for_the_engines_ids_at_every_turn():
    s = _trajectory()
    assert token_exact(s, s.sequence)
    assert tokens_exact([s], {0: s.sequence})


@pytest.mark.parametrize(
    "trained",
    [
        PROMPT + TURN1 + OBS[:-1] + TURN2 + [0],  # an observation re-encoded differently
        PROMPT + TURN1[:-1] + OBS + TURN2 + [2],  # a turn separator dropped (and the length kept)
        PROMPT + TURN1 + OBS + TURN2[:-1],  # the last turn cut short
        PROMPT + [8, 7, 2] + OBS + TURN2,  # turn 1 re-tokenised
    ],
)
def test_token_exact_fails_on_any_difference(trained):
    assert not token_exact(_trajectory(), trained)


def test_a_sample_without_the_engines_record_is_not_exact():
    s = _trajectory()
    s.engine_spans = None
    assert not token_exact(s, s.sequence)


def test_a_loss_mask_must_cover_every_token():
    with pytest.raises(ValueError, match="loss mask of 2 for 3 tokens"):
        Sample(0, 0, [1], [2, 3, 4], [0.0] * 3, "stop", False, 0, loss_mask=[1, 0])


def test_turn_penalty_shapes_rewards_per_extra_turn():
    from megatron_rl.loop.step.rl_batch import shaped_rewards

    one, two = _trajectory(), _trajectory()
    one.turns = 1
    r = shaped_rewards([one, two], AlgorithmConfig(), 16, turn_penalty=0.1)
    assert r.tolist() == pytest.approx([1.0, 0.9])
    assert shaped_rewards([one, two], AlgorithmConfig(), 16).tolist() == [1.0, 1.0]


def test_the_mismatch_error_names_the_sample_and_what_is_kept():
    from megatron_rl.loop.step.rl_batch import mismatch_message

    s = _trajectory()
    msg = mismatch_message(7, [s], {0: s.sequence[:-1] + [0]})
    assert msg.startswith("step 7:") and "sample 0/0" in msg and "ids that differ" in msg
    assert "not trained" in msg and "last checkpoint stays the newest" in msg
    assert not tokens_exact([s], {0: s.sequence[:-1] + [0]})


def test_a_trajectory_whose_environment_never_started_trains_its_prompt_only():
    s = Sample(
        0, 0, list(PROMPT), [], [], "stop", False, 1, status="env_error", loss_mask=[], engine_spans=[]
    )
    assert token_exact(s, PROMPT)
    assert not token_exact(s, PROMPT + [3])


def test_a_carried_sample_from_a_checkpoint_without_engine_spans_is_taken_as_saved():
    from dataclasses import asdict

    from megatron_rl.loop.step.carry import _restored

    record = asdict(_trajectory())
    record.pop("engine_spans")
    s = _restored(record)
    assert token_exact(s, s.sequence)
    kept = _restored(asdict(_trajectory()))
    assert not token_exact(kept, kept.sequence[:-1] + [0])  # a record that has them is still checked
