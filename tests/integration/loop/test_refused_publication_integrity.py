"""A run whose weights go non-finite (optim.lr=inf): every publication after the first is refused,
the engines keep sampling with version 1, the step records say so, and the default policy (stop after
3 refusals in a row) ends the run with a message that names the tensors."""

import pytest

from tests.helpers.tiny_run import launch, records

pytestmark = [pytest.mark.slow, pytest.mark.vllm]


def test_non_finite_weights_are_never_served_and_the_run_stops_after_three_refusals(tmp_path):
    proc = launch(tmp_path, 6, ["optim.lr=inf", "logger.wandb=false"], name="nan", wait=False)
    rc = proc.wait(timeout=900)
    out = (tmp_path / "nan.log").read_text()
    assert rc != 0, out[-3000:]
    recs = records(tmp_path, "nan")
    assert [r["step"] for r in recs] == [1, 2, 3]  # the 4th step's publication is the 3rd refusal
    first, refused = recs[0], recs[1:]
    assert first["publication"]["activated"] and first["publication"]["refused"] == []
    for r in refused:
        p = r["publication"]
        assert not p["activated"] and p["active_version"] == 1 and r["version"] == 1
        assert p["action"] == "sampled with the active version 1"
        assert "non-finite values (NaN or Inf)" in p["refused"][0]
    head = "weight publication refused 3 times in a row (rollout.on_refused_publication=stop"
    assert out.count(head) == 1 and "version 1 keeps serving" in out
