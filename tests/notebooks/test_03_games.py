import pytest
from nbutil import execute_notebook


@pytest.mark.slow
def test_games_notebook_runs():
    execute_notebook("notebooks/03_games.ipynb", timeout=300)
