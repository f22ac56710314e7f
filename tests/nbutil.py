"""Execute a notebook in a fresh kernel, as the tests do for every notebook in notebooks/."""

from __future__ import annotations

import os
import pathlib

import nbformat
from nbclient import NotebookClient

REPO = pathlib.Path(__file__).resolve().parents[1]


def execute_notebook(relpath: str, timeout: int = 600) -> nbformat.NotebookNode:
    """Run every cell of ``REPO/relpath`` (cwd = a temp copy dir is not used: cwd = notebooks/).

    Raises ``nbclient.exceptions.CellExecutionError`` on the first failing cell.
    The kernel inherits ``JAXRL_REASON_SMALL=1`` so notebooks can pick small settings.
    """
    path = REPO / relpath
    nb = nbformat.read(path, as_version=4)
    os.environ["JAXRL_REASON_SMALL"] = "1"
    client = NotebookClient(
        nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}
    )
    client.execute()
    return nb
