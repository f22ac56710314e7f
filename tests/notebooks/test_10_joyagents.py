import pytest

from nbutil import execute_notebook


@pytest.mark.slow
def test_joyagents_notebook_runs():
    execute_notebook("notebooks/10_joyagents.ipynb", timeout=600)
