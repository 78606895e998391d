"""transformer-engine is detected through `transformer_engine.pytorch` (models/megatron.py,
system/machine.py): TE's package `__init__` swallows a failed import of its PyTorch module, so a TE whose torch
extension is missing or built for another torch imports "fine" and the TE layer spec then fails deep in the
model build. Simulated here with a stand-in `transformer_engine` package whose `__init__` does what TE
2.11's does (`try: from . import pytorch / except ImportError: pass`) and whose `pytorch` fails, in a fresh
interpreter that reports CUDA present (as on a GPU node)."""

import json
import subprocess
import sys

from tests.helpers.launch import REPO

TE_INIT = "try:\n    from . import pytorch\nexcept ImportError:\n    pass\n__version__ = '2.11.0'\n"
BROKEN = "raise ImportError('libtransformer_engine_torch.so: undefined symbol: _ZN3c104cuda9SetDevice')\n"
PROBE = """
import json, torch
torch.cuda.is_available = lambda: True  # a GPU node
import transformer_engine  # succeeds: the failure is swallowed
from megatron_rl.system.machine import te_import_error
from megatron_rl.models.megatron import transformer_engine_available
print(json.dumps({"top_level": transformer_engine.__version__, "available": transformer_engine_available(),
                  "error": te_import_error()}))
"""


def _probe(tmp_path, pytorch_module: str) -> tuple[dict, str]:
    pkg = tmp_path / "transformer_engine"
    (pkg / "pytorch").mkdir(parents=True)
    (pkg / "__init__.py").write_text(TE_INIT)
    (pkg / "pytorch" / "__init__.py").write_text(pytorch_module)
    env = {"PYTHONPATH": f"{tmp_path}:{REPO}", "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


def test_a_te_whose_pytorch_module_fails_counts_as_unavailable_with_the_reason(tmp_path):
    out, log = _probe(tmp_path, BROKEN)
    assert out["top_level"] == "2.11.0", "the stand-in imports at the top level, as a broken TE does"
    assert out["available"] is False
    assert (
        out["error"]
        == "ImportError: libtransformer_engine_torch.so: undefined symbol: _ZN3c104cuda9SetDevice"
    )
    assert "transformer_engine.pytorch does not import" in log and "--no-build-isolation" in log


def test_a_te_whose_pytorch_module_imports_is_available_on_a_gpu_node(tmp_path):
    out, _ = _probe(tmp_path, "")
    assert out["available"] is True and out["error"] is None
