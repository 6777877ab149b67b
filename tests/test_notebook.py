"""play.ipynb runs top to bottom offline: on a local GPT-2 directory of any size, on our checkpoints (whatever
their tokenizer), and on its random-init fallback; it labels every model figure with what it shows."""

import dataclasses
import re
import sys
from pathlib import Path

import nbclient
import nbformat
import pytest

pytestmark = pytest.mark.gpt2_contract  # the notebook looks inside GPT-2: its module names, its Hugging Face form
ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "play.ipynb"
RANDOM_LABEL = "random init — not the trained GPT-2"
CHARS = "".join(sorted(set((ROOT / "input.txt").read_text(encoding="utf-8"))))  # `fineweb.py --tokenizer char`'s


def code_cells(nb) -> list[str]:
    return [cell.source for cell in nb.cells if cell.cell_type == "code"]


@dataclasses.dataclass
class Run:
    text: str  # everything printed
    images: int  # figures shown


def execute(runs: list[tuple[str, Path]], extra_code: str = "", until: str = "") -> list[Run]:
    """Run play.ipynb once per (GPT2_MODEL, LOG_DIR) of runs, from the repo root, with extra_code appended; stop
    before the markdown cell starting with `until` if given. All runs share one fresh kernel (the venv's:
    ipykernel's python3 spec launches sys.executable), transformers is imported once, and `%reset -f` empties
    the namespace before each run, so every run executes every cell as a fresh kernel would."""
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    cells = notebook.cells
    if until:
        cells = cells[: [c.cell_type == "markdown" and c.source.startswith(until) for c in cells].index(True)]
    nb, parts = nbformat.v4.new_notebook(metadata=notebook.metadata), []
    for gpt2_model, log_dir in runs:
        settings = ("%reset -f\nimport os\n"
                    f"os.environ.update(GPT2_MODEL={str(gpt2_model)!r}, LOG_DIR={str(log_dir)!r})")
        part = [nbformat.v4.new_code_cell(settings), *nbformat.from_dict(cells), nbformat.v4.new_code_cell(extra_code)]
        parts.append(slice(len(nb.cells), len(nb.cells) + len(part)))
        nb.cells += part
    resources = {"metadata": {"path": str(ROOT)}}  # the working directory: train_gpt2 and input.txt are found
    nbclient.NotebookClient(nb, kernel_name="python3", timeout=600, resources=resources).execute()  # raises on an error
    outputs = [[out for cell in nb.cells[part] if cell.cell_type == "code" for out in cell.outputs] for part in parts]
    return [Run("".join(out.get("text", "") + out.get("data", {}).get("text/plain", "") for out in outs),
                sum("image/png" in out.get("data", {}) for out in outs)) for outs in outputs]


def number_after(label: str, text: str) -> float:
    match = re.search(re.escape(label) + r"\s*([0-9.e+-]+)", text)
    assert match, f"{label!r} not printed"
    return float(match.group(1))


def check_residual_stream(text: str):
    """The residual-stream cell: 100 summed steps of std 1 have std √100 = 10; scaled by 100^-½, std 1."""
    assert 8.5 < number_after("std after 100 steps:", text) < 11.5
    assert 0.85 < number_after("std after 100 steps scaled by n^-½:", text) < 1.15


def check_model_cells(text: str):
    """The attention map by hand is transformers' own, and our GPT computes transformers' logits."""
    assert number_after("max |by hand - transformers| =", text) < 1e-5
    assert number_after("max |our logits - transformers' logits| on the prompt =", text) < 1e-4


def save_checkpoint(path: Path, vocab_size: int, **extra) -> str:
    """A small checkpoint (2 layers, 2 heads, width 48, context 16) with the entries of train_gpt2's that
    play.ipynb reads, plus extra."""
    import torch

    from train_gpt2 import GPT, GPTConfig

    cfg = GPTConfig(block_size=16, vocab_size=vocab_size, n_layer=2, n_head=2, n_embd=48)
    torch.manual_seed(0)
    torch.save({"model": GPT(cfg).state_dict(), "model_config": dataclasses.asdict(cfg), **extra}, path)
    return str(path)


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
def test_notebook_runs_on_a_local_model(tmp_path):
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    from test_plot import write_log

    # GPT-2's context and vocabulary, >= 300 channels, >= 2 layers: the course's numbers apply unchanged.
    torch.manual_seed(0)
    GPT2LMHeadModel(GPT2Config(n_positions=1024, n_embd=320, n_layer=2, n_head=4)).save_pretrained(tmp_path / "model")
    log_dir = write_log(tmp_path / "run")
    (log_dir / "header.txt").write_text('{"data": {"dataset": "fineweb-edu"}}\n')  # GPT-2's reference applies
    show_python = "import sys\nprint('kernel python:', sys.executable)"
    [run] = execute([(tmp_path / "model", log_dir)], show_python)
    text = run.text

    assert f"kernel python: {sys.executable}" in text  # the venv's interpreter, not whatever is on PATH
    assert f"loaded {tmp_path / 'model'}" in text and RANDOM_LABEL not in text
    assert "transformer.wpe.weight" in text and "(1024, 320)" in text
    check_model_cells(text)
    assert text.count("> Hello, I'm a language model,") == 10  # 5 samples from each loop
    assert "x =" in text and "y =" in text
    assert "val loss 8.5000 at step 10; GPT-2 124M: 3.2924" in text
    assert run.images == 5  # wpe, its channels, the weight block, weight vs attention, the training curves
    assert (log_dir / "curves.png").is_file()
    check_residual_stream(text)
    # the init that follows from it: c_proj at 0.02 · (2·12)^-½ = 0.0041, every other weight at 0.02
    for name, std in [("attn.c_attn", 0.02), ("attn.c_proj", 0.0041), ("mlp.c_fc", 0.02), ("mlp.c_proj", 0.0041)]:
        assert number_after(f"fresh GPT: std of h.0.{name}.weight =", text) == pytest.approx(std, rel=0.05)


@pytest.mark.slow
def test_notebook_falls_back_to_a_labelled_random_model(tmp_path):
    # Up to the sampling section: generating with a 124M model is the slow part, and the local-model test
    # runs it already.
    [run] = execute([(tmp_path / "no-such-model", tmp_path / "no-run")], "print('TAG:', TAG)", until="## Sampling")
    text = run.text

    assert "RANDOMLY INITIALISED GPT-2 124M" in text
    assert f"TAG: {RANDOM_LABEL}" in text
    assert "124.4M parameters: 12 layers, 12 heads, width 768" in text
    assert number_after("max |by hand - transformers| =", text) < 1e-5
    check_residual_stream(text)


@pytest.mark.slow
def test_notebook_runs_on_small_models_and_our_checkpoints(tmp_path):
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    # A Hugging Face directory narrower than the 300-channel corner and than channel 150, with one layer and a
    # context shorter than the sentence (11 tokens) and the prompt (8 tokens); and one of our checkpoints, its
    # token table padded to 50304 rows as training does.
    torch.manual_seed(0)
    GPT2LMHeadModel(GPT2Config(n_positions=8, n_embd=64, n_layer=1, n_head=2)).save_pretrained(tmp_path / "hf")
    checkpoint = save_checkpoint(tmp_path / "model_00100.pt", vocab_size=50304)
    small, ours = execute([(tmp_path / "hf", tmp_path / "no-run"), (checkpoint, tmp_path / "no-run")])

    assert f"loaded {tmp_path / 'hf'}" in small.text and "tokenizer: gpt2, 50,257 tokens" in small.text
    assert "1 layers, 2 heads, width 64, context 8" in small.text and "(8, 64)" in small.text
    check_model_cells(small.text)
    assert small.text.count("> Hello, I'm a language model") == 10  # the prompt cut to 7 tokens, 1 sampled
    assert small.images == 4  # no training curves

    assert f"loaded {checkpoint}" in ours.text and RANDOM_LABEL not in ours.text
    assert "2 layers, 2 heads, width 48, context 16, vocabulary 50257" in ours.text  # export_hf drops the padding
    assert "tokenizer: gpt2, 50,257 tokens" in ours.text
    check_model_cells(ours.text)
    assert ours.text.count("> Hello, I'm a language model,") == 10 and ours.images == 4
    for run in (small, ours):
        check_residual_stream(run.text)


@pytest.mark.slow
def test_notebook_runs_on_character_level_checkpoints(tmp_path):
    # The tokenizer is on record in the checkpoint (training writes it there) and the notebook uses it; or it is
    # not, and GPT-2's 50,257 ids do not fit the model's 77: the cells that need text are skipped, the others run.
    char = {"tokenizer": "char", "vocab": CHARS}
    checkpoints = [save_checkpoint(tmp_path / "recorded.pt", len(CHARS), tokenizer=char),
                   save_checkpoint(tmp_path / "unknown.pt", len(CHARS), train_config={"data_root": str(tmp_path)})]
    *known, unknown = execute([(path, tmp_path / "no-run") for path in checkpoints])

    for path, run in zip(checkpoints, known):
        assert f"loaded {path}" in run.text and "tokenizer: char, 77 tokens" in run.text
        assert "2 layers, 2 heads, width 48, context 16, vocabulary 77" in run.text
        check_model_cells(run.text)
        assert run.text.count("> Hello, I'm a la") == 10 and run.images == 4  # 15 characters of prompt fit
        after = run.text.split("300 characters from our loop (")[1].split("):\n", 1)[1]
        sample = after[: after.index((ROOT / "input.txt").read_text(encoding="utf-8")[:100])]  # the next cell's print
        assert len(sample) >= 300 and set(sample) <= set(CHARS)  # a few hundred characters of its vocabulary

    assert f"loaded {checkpoints[-1]}" in unknown.text
    assert "no tokenizer for a vocabulary of 77 (gpt2 has 50,257 tokens)" in unknown.text
    assert "max |by hand" not in unknown.text and "generate" not in unknown.text and unknown.images == 3
    for run in (*known, unknown):
        check_residual_stream(run.text)
