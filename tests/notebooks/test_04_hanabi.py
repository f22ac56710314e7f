import pytest

from nbutil import execute_notebook


@pytest.mark.slow
def test_hanabi_notebook_runs():
    execute_notebook("notebooks/04_hanabi.ipynb", timeout=300)
