from nbutil import execute_notebook


def test_your_agent_notebook_runs():
    nb = execute_notebook("notebooks/13_your_agent.ipynb", timeout=600)
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    assert "before:" in text and "after:" in text
