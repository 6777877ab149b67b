"""export_hf.py writes one of our checkpoints as a Hugging Face GPT-2 directory that transformers loads and that
computes exactly what our model computes. Part of the GPT-2 contract: the export maps GPT-2's module names."""

import dataclasses
import json
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import export_hf
import fineweb
import launcher
import train_gpt2
from train_gpt2 import GPT, GPTConfig
from helpers import child_env

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.gpt2_contract


def run_script(script: str, *args) -> subprocess.CompletedProcess:
    return launcher.run([sys.executable, str(ROOT / script), *args], cwd=ROOT, env=child_env(), timeout=300)


def make_checkpoint(path: Path, config: GPTConfig, seed: int = 0) -> GPT:
    """A random model, nudged off its init (biases and LayerNorms not 0/1, so a wrong mapping shows), saved
    as training saves it."""
    torch.manual_seed(seed)
    model = GPT(config)
    with torch.no_grad():
        for p in model.parameters():  # unique parameters: the tied token table is nudged once
            p.add_(0.02 * torch.randn_like(p))
    torch.save({"model": model.state_dict(), "model_config": dataclasses.asdict(config)}, path)
    return model.eval()


def hf_and_our_outputs(hf_dir: Path, model: GPT, vocab: int, T: int):
    """(HF logits, HF loss, our logits cut to the exported vocabulary, our loss over those logits)."""
    from transformers import GPT2LMHeadModel

    hf = GPT2LMHeadModel.from_pretrained(hf_dir).eval()
    x = torch.randint(0, vocab, (2, T), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        hf_out = hf(x, labels=x)  # transformers shifts the labels itself
        logits = model(x)[0][..., :vocab]
    loss = F.cross_entropy(logits[:, :-1].reshape(-1, vocab), x[:, 1:].reshape(-1))
    return hf_out.logits, hf_out.loss, logits, loss


def test_to_hf_state_dict_transposes_and_drops_padding():
    torch.manual_seed(0)
    ours = GPT(GPTConfig(block_size=8, vocab_size=80, n_layer=1, n_head=2, n_embd=8)).state_dict()
    hf = export_hf.to_hf_state_dict(ours, keep_vocab=50)
    assert set(hf) == set(ours)
    for key in ("transformer.wte.weight", "lm_head.weight"):
        assert torch.equal(hf[key], ours[key][:50])
    for key, value in ours.items():
        if key.endswith(train_gpt2.HF_TRANSPOSED):
            assert torch.equal(hf[key], value.t())
        elif "wte" not in key and "lm_head" not in key:
            assert torch.equal(hf[key], value)
    # without padding to drop, it is the exact inverse of the import
    back = train_gpt2.convert_hf_state_dict(export_hf.to_hf_state_dict(ours), ours)
    assert all(torch.equal(back[k], ours[k]) for k in ours)


def test_export_round_trip_matches_our_logits_and_loss(tmp_path):
    config = GPTConfig(block_size=16, vocab_size=64, n_layer=2, n_head=2, n_embd=32)
    model = make_checkpoint(tmp_path / "ckpt.pt", config)
    out = export_hf.export_hf(tmp_path / "ckpt.pt", tmp_path / "hf")
    hf_config = json.loads((out / "config.json").read_text())
    assert hf_config["vocab_size"] == 64  # a vocabulary smaller than GPT-2's is kept as is
    assert (hf_config["n_positions"], hf_config["n_ctx"], hf_config["n_embd"]) == (16, 16, 32)
    assert (hf_config["n_layer"], hf_config["n_head"], hf_config["activation_function"]) == (2, 2, "gelu_new")
    hf_logits, hf_loss, logits, loss = hf_and_our_outputs(out, model, 64, 16)
    torch.testing.assert_close(hf_logits, logits, atol=1e-5, rtol=0)
    torch.testing.assert_close(hf_loss, loss, atol=1e-5, rtol=0)


def test_export_of_a_missing_checkpoint_is_an_error(tmp_path):
    with pytest.raises(SystemExit) as exc:
        export_hf.main([str(tmp_path / "missing.pt"), str(tmp_path / "hf")])
    assert str(exc.value.code).startswith("export_hf.py: error: ") and "does not exist" in str(exc.value.code)
    assert not (tmp_path / "hf").exists()


def write_hellaswag_jsonl(path: Path, n: int = 24) -> Path:
    """n small HellaSwag-shaped examples (ctx, 4 endings, label) of ordinary English words."""
    rng = random.Random(0)
    people, places = ["A man", "A woman", "The girl", "The chef", "A dog"], ["kitchen", "park", "river", "gym"]
    actions = ["runs to the door", "picks up a ball", "starts to cook dinner", "jumps into the water",
               "sits down and reads", "waves at the camera", "lifts a heavy box", "paints the wall blue"]
    lines = []
    for i in range(n):
        ctx = f"{rng.choice(people)} is in the {rng.choice(places)}. Then he"
        lines.append(json.dumps({"ind": i, "ctx": ctx, "endings": rng.sample(actions, 4), "label": rng.randrange(4)}))
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.slow
def test_export_cli_padded_vocab_scores_the_same_on_hellaswag(tmp_path, capsys):
    if not (ROOT / "hellaswag.py").is_file():
        pytest.skip("hellaswag.py is not in the repository yet")
    config = GPTConfig(block_size=64, vocab_size=50304, n_layer=1, n_head=2, n_embd=16)
    torch.manual_seed(0)
    model = GPT(config)
    with torch.no_grad():
        # A trained model gives the 47 padded ids (never targets) negligible probability; mimic that, so
        # dropping them changes no softmax by more than rounding: zero rows, and logits of a few units.
        model.transformer.wte.weight[fineweb.GPT2_VOCAB_SIZE :] = 0
        model.transformer.ln_f.weight.mul_(50)
    ckpt = tmp_path / "model_00010.pt"
    torch.save({"model": model.state_dict(), "model_config": dataclasses.asdict(config)}, ckpt)

    result = run_script("export_hf.py", ckpt, tmp_path / "hf")
    assert result.returncode == 0, result.stderr
    hf_config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert hf_config["vocab_size"] == 50257  # 50304 -> 50257: the padding is gone
    hf_logits, _, logits, _ = hf_and_our_outputs(tmp_path / "hf", model.eval(), 50257, 64)
    assert hf_logits.shape[-1] == 50257
    torch.testing.assert_close(hf_logits, logits, atol=1e-5, rtol=0)

    import hellaswag  # its CLI in-process: two interpreter start-ups saved

    data = write_hellaswag_jsonl(tmp_path / "hellaswag.jsonl")
    scores = []
    for source in (ckpt, tmp_path / "hf"):
        assert hellaswag.main(["--model", str(source), "--data", str(data), "--device", "cpu"]) == 0
        scores.append(capsys.readouterr().out.strip().splitlines()[-1])
    assert re.fullmatch(r"24 acc: \d\.\d{4} acc_norm: \d\.\d{4}", scores[0]), scores[0]
    assert scores[0] == scores[1]
