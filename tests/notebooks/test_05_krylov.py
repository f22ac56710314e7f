import pytest

from nbutil import execute_notebook


@pytest.mark.slow
def test_krylov_notebook_runs():
    execute_notebook("notebooks/05_krylov.ipynb", timeout=600)
