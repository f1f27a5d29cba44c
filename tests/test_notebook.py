"""demo/dbml.ipynb runs headless (nbclient, a Jupyter kernel) and shows what it says."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")
pytest.importorskip("matplotlib")

NOTEBOOK = Path(__file__).parents[1] / "demo" / "dbml.ipynb"


@pytest.mark.slow   # a kernel, four small trainings: ~15 s
def test_the_demo_notebook_runs_and_its_models_learn(tmp_path):
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    text = "\n".join(o.text for o in outputs if o.output_type == "stream" and o.name == "stdout")
    accuracy = {m: float(a) for m, a in re.findall(r"(\w+): .*?test accuracy (\d\.\d+)", text)}
    assert accuracy["moons_mlp"] > 0.95 and accuracy["digits_cnn"] > 0.9 and accuracy["tickets"] > 0.8, accuracy
    assert "versions of moons_linear: 1" in text                 # three looks, one training
    assert re.search(r"planned peak (\d+) budget 2000000", text)
    images = [o for o in outputs if o.output_type == "display_data" and "image/png" in o.data]
    assert len(images) == 2                                        # the history and the memory plots
    progress = "\n".join(o.text for o in outputs if o.output_type == "stream" and o.name == "stderr")
    assert "moons_mlp (job 1)" in progress                        # a bar per job (tqdm, in a kernel)
