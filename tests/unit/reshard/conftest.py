"""One intra-op thread: these tests run many small tensor ops, where thread hand-offs cost more than
the work (3x slower with the default pool on this 2-core machine shared with other jobs)."""

import pytest
import torch


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
