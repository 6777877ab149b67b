"""play.ipynb runs top to bottom offline, in a kernel of this venv: on a local Hugging Face GPT-2,
on one of our character-level checkpoints with its run's curves, and on its labelled random-init
fallback; every figure names the model (or the run) it shows; it is saved without outputs."""

import json
import sys

import nbclient
import nbformat
import pytest
from conftest import ROOT, child_env, train_tiny
from test_plot import write_log, write_runs

import fineweb
import plot

NOTEBOOK = ROOT / "play.ipynb"
RANDOM = "RANDOM INIT, not a trained GPT-2"

# Run before the notebook: every figure rendered (by plt.show or display) is recorded with its
# suptitle, axes titles and legend texts, to be printed as one JSON line after the last cell.
RECORD = """
import matplotlib.backend_bases

_drawn = []
_print_figure = matplotlib.backend_bases.FigureCanvasBase.print_figure


def _record(canvas, *args, **kwargs):
    fig = canvas.figure
    legends = [ax.get_legend() for ax in fig.axes if ax.get_legend()]
    _drawn.append(
        {
            "suptitle": fig.get_suptitle(),
            "titles": [ax.get_title() for ax in fig.axes],
            "legends": [t.get_text() for legend in legends for t in legend.get_texts()],
        }
    )
    return _print_figure(canvas, *args, **kwargs)


matplotlib.backend_bases.FigureCanvasBase.print_figure = _record
"""
REPORT = """
import json
import sys

print("KERNEL " + sys.executable)
print("FIGURES " + json.dumps(_drawn))
"""


def execute(gpt2_model, log_dir, cells=None):
    """Run play.ipynb (its first `cells` cells, or all) in a fresh python3 kernel from the repo
    root, GPT2_MODEL (None: unset) and LOG_DIR in its environment. Returns (what it printed,
    the figures it drew)."""
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nb.cells = [
        nbformat.v4.new_code_cell(RECORD),
        *nb.cells[:cells],
        nbformat.v4.new_code_cell(REPORT),
    ]
    env = child_env(LOG_DIR=str(log_dir))
    env.pop("GPT2_MODEL", None)
    if gpt2_model is not None:
        env["GPT2_MODEL"] = str(gpt2_model)
    client = nbclient.NotebookClient(
        nb, kernel_name="python3", timeout=300, resources={"metadata": {"path": str(ROOT)}}
    )
    client.execute(env=env)  # raises CellExecutionError on a cell's error
    outputs = [out for cell in nb.cells if cell.cell_type == "code" for out in cell.outputs]
    text = "".join(out.get("text", "") for out in outputs)
    images = sum("image/png" in out.get("data", {}) for out in outputs)
    report = dict(line.split(" ", 1) for line in text.splitlines()[-2:])
    figures = json.loads(report["FIGURES"])
    assert report["KERNEL"] == sys.executable  # the venv's interpreter, not another python3
    assert images == len(figures)
    return text, figures


def check_model_figures(figures, tag):
    """The position table, the init experiment, the attention map: each names its model."""
    positions, init, attention = figures[:3]
    assert positions["suptitle"] == f"position table of {tag}"
    assert init["suptitle"] == "fresh train_gpt2.GPT (random init): 12 layers, width 256"
    assert attention["suptitle"].startswith("attention of layer") and tag in attention["suptitle"]


def check_init(text):
    """c_proj starts at 0.02 * (2 * 12) ** -0.5, the rest at 0.02, and the stream stays small."""
    for name, std in [("attn.c_attn", 0.02), ("attn.c_proj", 0.0041), ("mlp.c_fc", 0.02)]:
        assert f"std of h.0.{name}.weight: {std:.4f}" in text
    scaled = float(text.split("stream std after 12 blocks: ")[1].split()[0])
    unscaled = float(text.split(" with c_proj at 0.02")[0].split()[-1])
    assert 3 * scaled < unscaled


def check_attention(text):
    """The attention worked out by hand is the model's own."""
    assert float(text.split("max |by hand - the model's attention| = ")[1].split()[0]) < 1e-5


def test_notebook_is_saved_without_outputs():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    assert nb.metadata.kernelspec.name == "python3"
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert not cell.outputs and cell.execution_count is None, "save it with outputs cleared"


@pytest.mark.slow
@pytest.mark.gpt2_contract
def test_notebook_on_a_local_hugging_face_gpt2(tmp_path):
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    hf = GPT2LMHeadModel(GPT2Config(n_positions=64, n_embd=32, n_layer=2, n_head=2))
    hf.save_pretrained(tmp_path / "hf")
    n_params = sum(p.numel() for p in hf.parameters())  # the tied table once
    # a FineWeb-Edu run: GPT-2 124M's reference lines are drawn
    run = write_log(tmp_path / "run")
    write_runs(run, "fineweb-edu")
    text, figures = execute(tmp_path / "hf", run)

    tag = str(tmp_path / "hf")
    assert f"loaded {tag}" in text and RANDOM not in text
    assert f"{tag}: {n_params:,} parameters, 2 layers, 2 heads," in text
    assert "width 32, context 64, 50,257 token rows" in text
    assert "tokenizer: gpt2, 50,257 tokens" in text
    assert "transformer.wpe.weight               (64, 32)" in text
    assert f"nearest tokens in wte ({tag}):" in text
    check_init(text)
    check_attention(text)
    assert "layer 1, 11 tokens:" in text  # the middle block, the sentence in GPT-2's tokens
    for i in range(4):
        assert f"sample {i}: Hello, I'm a language model," in text
    assert len(figures) == 4
    check_model_figures(figures, tag)
    curves = figures[3]
    assert curves["suptitle"] == f"training curves of {run}"
    assert "GPT-2 124M val (3.2924)" in curves["legends"]
    assert "val 8.5000 at step 10" in text and "hella 0.2700 at step 10" in text


@pytest.mark.slow
@pytest.mark.gpt2_contract
def test_notebook_on_our_character_level_checkpoint_and_its_run(tmp_path):
    corpus = tmp_path / "data"
    run = tmp_path / "run"
    fineweb.main(
        ["--local", str(ROOT / "input.txt"), "--tokenizer", "char", "--out_dir", str(corpus)]
    )
    train_tiny(corpus, run, seq_len=32, max_steps=4)
    vocab = json.loads((corpus / "manifest.json").read_text())["vocab"]
    text, figures = execute(run / "model_00004.pt", run)

    tag = str(run / "model_00004.pt")
    assert f"loaded {tag}" in text and RANDOM not in text
    assert f"width 32, context 32, {len(vocab)} token rows" in text
    assert f"tokenizer: char, {len(vocab)} tokens" in text
    check_init(text)
    check_attention(text)
    assert "layer 1, 32 tokens:" in text  # the sentence's first 32 characters
    # 4 samples of a new line and 300 characters, each in the model's vocabulary
    samples = text.split(f"4 samples of 300 new tokens from {tag}:\n")[1]
    for i in range(4):
        sample = samples.split(f"sample {i}: ")[1][:301]
        assert sample.startswith("\n") and set(sample) <= set(vocab)
        assert samples.split(f"sample {i}: ")[1][301] == "\n"
    assert len(figures) == 4
    check_model_figures(figures, tag)
    curves = figures[3]
    assert curves["suptitle"] == f"training curves of {run}"
    assert "loss" in curves["titles"] and "bpb" in curves["titles"]
    assert not any("GPT-2 124M" in label for label in curves["legends"])  # not FineWeb-Edu
    step, val = plot.read_log(run / "log.txt")["val"][-1]
    assert step == 4 and f"val {val:.4f} at step 4" in text


@pytest.mark.gpt2_contract
def test_notebook_offline_falls_back_to_a_labelled_random_model(tmp_path):
    # GPT2_MODEL unset: gpt2 from the hub, which HF_HUB_OFFLINE=1 (conftest) makes unreachable
    text, figures = execute(None, tmp_path / "no-run")

    assert "could not load gpt2 from the hub" in text and "loaded gpt2" not in text
    assert f"{RANDOM}: " in text and "4 layers, 4 heads," in text
    assert "tokenizer: gpt2, 50,257 tokens" in text
    assert f"nearest tokens in wte ({RANDOM}):" in text
    assert f"4 samples of 32 new tokens from {RANDOM}:" in text
    check_init(text)
    check_attention(text)
    assert len(figures) == 3  # no curves without a run
    check_model_figures(figures, RANDOM)
    assert f"no curves: {tmp_path / 'no-run' / 'log.txt'} is missing or empty" in text


def test_a_named_model_that_does_not_load_is_an_error_not_a_stand_in(tmp_path):
    missing = tmp_path / "model_00100.pt"
    with pytest.raises(nbclient.exceptions.CellExecutionError) as error:
        execute(missing, tmp_path, cells=3)  # the settings and the loading cell
    assert error.value.ename == "ValueError"  # raised, not printed and replaced
    assert error.value.evalue.startswith(f"GPT2_MODEL={missing}: cannot read checkpoint {missing}")
