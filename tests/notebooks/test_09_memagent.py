import pytest

from nbutil import execute_notebook


@pytest.mark.slow
def test_memagent_notebook_runs():
    execute_notebook("notebooks/09_memagent.ipynb", timeout=600)
