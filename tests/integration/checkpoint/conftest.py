"""The uninterrupted run that both kill-and-resume tests compare against, launched once per session: the
tiny recipe, 4 steps, a checkpoint saved (asynchronously) after every step (tests/helpers/tiny_run.py
SAVE_EVERY_STEP). test_resume.py kills the same run at a random moment after step 2's record,
test_resume_integrity.py in the middle of a save; both compare what their resumed run trains with these
records, and test_resume.py resumes and exports this run's checkpoints at other layouts."""

from __future__ import annotations

import pytest

from tests.helpers.tiny_run import RESUME_STEPS, SAVE_EVERY_STEP, launch


@pytest.fixture(scope="session")
def uninterrupted(tmp_path_factory):
    """The folder of run `A`: its records in <folder>/outputs/A, its checkpoints in <folder>/ckpt/A."""
    tmp = tmp_path_factory.mktemp("uninterrupted")
    launch(tmp, RESUME_STEPS, SAVE_EVERY_STEP, name="A")
    return tmp
