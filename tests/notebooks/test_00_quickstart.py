import pytest

from nbutil import execute_notebook


@pytest.mark.slow
def test_quickstart_notebook_runs():
    execute_notebook("notebooks/00_quickstart.ipynb", timeout=300)
