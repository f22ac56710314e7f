import pytest

from nbutil import execute_notebook

pytest.importorskip("transformers")
pytest.importorskip("torch")


@pytest.mark.slow
def test_checkpoints_notebook_runs():
    execute_notebook("notebooks/11_checkpoints.ipynb", timeout=300)
