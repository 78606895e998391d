"""A run whose weights go non-finite: every publication after they do is refused, the engines keep
sampling with the last good version, the step records say so, and the default policy (stop after 3
refusals in a row) ends the run with a message that names the tensors.

The divergence is a real one from a valid recipe (the recipe check refuses optim.lr above 10): at
optim.lr=10 the first update leaves huge but finite weights, whose bytes publish whole but whose
log-probs the engines and the trainer no longer agree on (thousands of nats apart, or none comparable):
the log-prob probe (loop/placement/probe.py) refuses the version before it serves; the next forward overflows, its
gradients are NaN, and from then on the weights are NaN, which the manifest's check refuses."""

import pytest

from tests.helpers.tiny_run import launch, records

pytestmark = [pytest.mark.slow, pytest.mark.vllm]


def test_non_finite_weights_are_never_served_and_the_run_stops_after_three_refusals(tmp_path):
    # One minibatch: algorithm.old_logprobs=auto takes the update's own forward as the old log-probs,
    # refused publication or not (a recompute would score the older version's samples with the same
    # current weights); the agreement check still runs on that forward and shows the stale version.
    extra = ["optim.lr=10", "logger.wandb=false", "algorithm.minibatches=1"]
    proc = launch(tmp_path, 8, extra, name="nan", wait=False)
    rc = proc.wait(timeout=900)
    out = (tmp_path / "nan.log").read_text()
    assert rc != 0, out[-3000:]
    recs = records(tmp_path, "nan")
    pubs = [r["publication"] for r in recs]
    first_refused = next(i for i, p in enumerate(pubs) if not p["activated"])
    assert first_refused >= 1, "version 1 (the initial weights) must publish"
    good = recs[first_refused - 1]["version"]  # the last version that activated
    for r in recs[:first_refused]:
        assert r["publication"]["activated"] and r["publication"]["refused"] == []
        assert r["old_logprobs"] == "update_forward"
    refused = recs[first_refused:]
    assert len(refused) == 2, [r["step"] for r in recs]  # the next step's publication is the 3rd refusal
    for i, r in enumerate(refused):
        p = r["publication"]
        assert not p["activated"] and p["active_version"] == good and r["version"] == good
        assert p["action"] == f"sampled with the active version {good}"
        if i == 0:  # huge finite weights: the bytes are whole, the model they make is not the trainer's
            assert p["refused"][0].startswith("log-prob probe (fp32 trainer, fp32 engine): engine ")
            assert p["probe"]["passed"] is False
        else:
            assert "non-finite values (NaN or Inf)" in p["refused"][0]
        assert r["old_logprobs"] == "update_forward" and r["logprob_agreement"]["tokens"] > 0
    head = "weight publication refused 3 times in a row (rollout.on_refused_publication=stop"
    assert out.count(head) == 1 and f"version {good} keeps serving" in out
