"""Every committed notebook executes without error on the CPU (so none of them rots)."""

from __future__ import annotations

import glob
import os
import shutil

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

NOTEBOOK_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                            "notebooks")
NOTEBOOKS = sorted(glob.glob(os.path.join(NOTEBOOK_DIR, "*.ipynb")))


def test_notebooks_are_committed():
    names = {os.path.basename(p) for p in NOTEBOOKS}
    assert {"01_quickstart.ipynb", "02_train_cnn.ipynb", "03_algorithms.ipynb",
            "04_flax_equinox.ipynb"} <= names


@pytest.mark.parametrize("path", NOTEBOOKS, ids=os.path.basename)
def test_notebook_executes(path, tmp_path, monkeypatch):
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    nb = nbformat.read(path, as_version=4)
    assert any(c.get("outputs") for c in nb.cells if c.cell_type == "code"), \
        "notebooks are committed with their outputs"
    shutil.copy(path, tmp_path)
    nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
