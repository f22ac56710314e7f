import pytest

from nbutil import execute_notebook


@pytest.mark.slow
def test_astro_notebook_runs():
    execute_notebook("notebooks/08_astro.ipynb", timeout=600)
