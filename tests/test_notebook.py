"""play.ipynb runs top to bottom offline, on a local GPT-2 directory and on its random-init fallback, and
labels every model figure with what it shows."""

import re
import sys
from pathlib import Path

import nbclient
import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "play.ipynb"
RANDOM_LABEL = "random init — not the trained GPT-2"


def code_cells(nb) -> list[str]:
    return [cell.source for cell in nb.cells if cell.cell_type == "code"]


def execute(nb, monkeypatch, gpt2_model: str, log_dir: Path, extra_code: str) -> str:
    """Run nb in a fresh kernel (the venv's: ipykernel's python3 spec launches sys.executable) from the repo
    root, with extra_code appended; return all printed text."""
    monkeypatch.setenv("GPT2_MODEL", gpt2_model)  # the kernel inherits this process's environment
    monkeypatch.setenv("LOG_DIR", str(log_dir))
    nb.cells.append(nbformat.v4.new_code_cell(extra_code))
    resources = {"metadata": {"path": str(ROOT)}}  # the working directory: train_gpt2 and input.txt are found
    client = nbclient.NotebookClient(nb, kernel_name="python3", timeout=600, resources=resources)
    client.execute()  # raises CellExecutionError on the first failing cell
    return "".join(out.get("text", "") + out.get("data", {}).get("text/plain", "")
                   for cell in nb.cells if cell.cell_type == "code" for out in cell.outputs)


def number_after(label: str, text: str) -> float:
    match = re.search(re.escape(label) + r"\s*([0-9.e+-]+)", text)
    assert match, f"{label!r} not printed"
    return float(match.group(1))


def test_notebook_is_clean_and_labels_every_model_figure():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    cells = [c for c in nb.cells if c.cell_type == "code"]
    assert all(not c.outputs and c.execution_count is None for c in cells), "commit play.ipynb without outputs"
    assert 'GPT2_MODEL = os.environ.get("GPT2_MODEL", "gpt2")' in cells[0].source
    assert 'LOG_DIR = os.environ.get("LOG_DIR", "log")' in cells[0].source
    drawing = [src for src in code_cells(nb) if "imshow(" in src or "plt.plot(" in src]
    assert len(drawing) >= 4
    for src in drawing:  # the fallback label travels in TAG: every title of a model figure must carry it
        titles = re.findall(r"(?:plt\.title|\.set_title)\((.*)", src)
        assert titles and all("TAG" in t for t in titles), src
    curves = [src for src in code_cells(nb) if "log.txt" in src]
    assert len(curves) == 1 and "plot.write_curves(" in curves[0]  # one plotting implementation


@pytest.mark.slow
def test_notebook_runs_on_a_local_model(tmp_path, monkeypatch):
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    from test_plot_export import write_log

    # Small but with the shapes the notebook indexes: 1024 positions, >= 300 channels, >= 2 layers, GPT-2's vocabulary.
    torch.manual_seed(0)
    GPT2LMHeadModel(GPT2Config(n_positions=1024, n_embd=320, n_layer=2, n_head=4)).save_pretrained(tmp_path / "model")
    log_dir = write_log(tmp_path / "run")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    show_python = "import sys\nprint('kernel python:', sys.executable)"
    text = execute(nb, monkeypatch, str(tmp_path / "model"), log_dir, show_python)

    assert f"kernel python: {sys.executable}" in text  # the venv's interpreter, not whatever is on PATH
    assert f"loaded {tmp_path / 'model'}" in text and RANDOM_LABEL not in text
    assert "transformer.wpe.weight" in text and "(1024, 320)" in text
    assert number_after("max |by hand - transformers| =", text) < 1e-5  # our attention map is the real one
    assert number_after("max |our logits - transformers' logits| on the prompt =", text) < 1e-4
    assert text.count("> Hello, I'm a language model,") == 10  # 5 samples from each loop
    assert "x =" in text and "y =" in text
    assert "val loss 8.5000 at step 10; GPT-2 124M: 3.2924" in text
    images = [out for cell in nb.cells if cell.cell_type == "code" for out in cell.outputs
              if "image/png" in out.get("data", {})]
    assert len(images) == 5  # wpe, its channels, the weight block, weight vs attention, the training curves
    assert (log_dir / "curves.png").is_file()


@pytest.mark.slow
def test_notebook_falls_back_to_a_labelled_random_model(tmp_path, monkeypatch):
    # Up to the sampling section: generating with a 124M model is the slow part, and the local-model test
    # runs it already.
    nb = nbformat.read(NOTEBOOK, as_version=4)
    stop = next(i for i, c in enumerate(nb.cells) if c.cell_type == "markdown" and c.source.startswith("## Sampling"))
    nb.cells = nb.cells[:stop]
    text = execute(nb, monkeypatch, str(tmp_path / "no-such-model"), tmp_path / "no-run", "print('TAG:', TAG)")

    assert "RANDOMLY INITIALISED GPT-2 124M" in text
    assert f"TAG: {RANDOM_LABEL}" in text
    assert "124.4M parameters: 12 layers, 12 heads, width 768" in text
    assert number_after("max |by hand - transformers| =", text) < 1e-5
