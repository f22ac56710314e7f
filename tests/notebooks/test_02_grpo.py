import pytest

from nbutil import execute_notebook


@pytest.mark.slow
def test_grpo_notebook_runs():
    execute_notebook("notebooks/02_grpo.ipynb", timeout=600)
