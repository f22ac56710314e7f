import pytest
from nbutil import execute_notebook


@pytest.mark.slow
def test_spiral_notebook_runs():
    execute_notebook("notebooks/07_spiral.ipynb", timeout=600)
