import pytest

from nbutil import execute_notebook


@pytest.mark.slow
def test_lm_stack_notebook_runs():
    execute_notebook("notebooks/01_lm_stack.ipynb", timeout=300)
