"""The one dtype map: every spelling of every dtype, the refusal of others, and no torch for the planner."""

import subprocess
import sys

import pytest
import torch

from megatron_rl.models.dtypes import RECIPE_DTYPES, dtype_bytes, hf_dtype_name, recipe_dtype, torch_dtype

CASES = [
    ("bf16", "bfloat16", torch.bfloat16),
    ("fp16", "float16", torch.float16),
    ("fp32", "float32", torch.float32),
]


@pytest.mark.parametrize("recipe,hf,tdtype", CASES)
def test_both_spellings_give_the_same_dtype(recipe, hf, tdtype):
    for name in (recipe, hf):
        assert recipe_dtype(name) == recipe
        assert hf_dtype_name(name) == hf
        assert torch_dtype(name) is tdtype
        assert dtype_bytes(name) == torch.empty(0, dtype=tdtype).element_size()


def test_every_recipe_dtype_is_mapped():
    assert sorted(RECIPE_DTYPES) == sorted(r for r, _, _ in CASES)


def test_unknown_names_are_refused_naming_the_accepted_ones():
    for name in ("auto", "float64", "torch.bfloat16", "BF16"):
        with pytest.raises(ValueError, match=r"dtype must be one of \['bf16', 'fp16', 'fp32', 'bfloat16'"):
            torch_dtype(name)
    with pytest.raises(ValueError, match="engine dtype must be one of"):
        hf_dtype_name("auto", "engine dtype")


def test_spec_and_this_module_import_without_torch():
    # The capacity planner imports models/spec.py, which counts bytes through models/dtypes.py.
    code = (
        "import sys; import megatron_rl.models.spec, megatron_rl.models.dtypes as d; "
        "assert d.dtype_bytes('bf16') == 2; assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
