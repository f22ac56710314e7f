import pytest

from nbutil import execute_notebook

pytest.importorskip("transformers")
pytest.importorskip("torch")


@pytest.mark.slow  # BPE + SFT start, 4 GRPO steps, evals, export, --steps 0 (134 s, 2 loaded cores)
def test_your_model_notebook_runs():
    execute_notebook("notebooks/12_your_model_and_data.ipynb", timeout=600)
