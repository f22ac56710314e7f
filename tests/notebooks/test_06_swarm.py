import pytest

from nbutil import execute_notebook


@pytest.mark.slow
def test_swarm_notebook_runs():
    execute_notebook("notebooks/06_swarm.ipynb", timeout=300)
