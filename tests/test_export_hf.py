"""export_hf.py writes one of our checkpoints as a complete Hugging Face GPT-2 directory: a model that computes exactly
what ours computes, and the tokenizer it was trained with, giving our ids (GPT-2's BPE or characters); transformers'
pipeline and lm-evaluation-harness run on it offline. Part of the GPT-2 contract: the export maps GPT-2's module
names."""

import dataclasses
import json
import random
import re
import subprocess
import textwrap
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
INPUT_TXT = (ROOT / "input.txt").read_text(encoding="utf-8")
CHARS = "".join(sorted(set(INPUT_TXT) | set(fineweb.DOC_SEPARATOR)))  # `fineweb.py --tokenizer char`'s vocabulary
GPT2_FILES = {"config.json", "generation_config.json", "model.safetensors", "vocab.json", "merges.txt",
              "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"}


def run_script(script: str, *args) -> subprocess.CompletedProcess:
    return launcher.run([sys.executable, str(ROOT / script), *args], cwd=ROOT, env=child_env(), timeout=300)


def make_checkpoint(path: Path, config: GPTConfig, seed: int = 0, nudge: float = 0.02, **extra) -> GPT:
    """A random model, nudged off its init by noise of std `nudge` (biases and LayerNorms not 0/1, so a wrong mapping
    shows), saved as training saves it, with extra entries (tokenizer=...)."""
    torch.manual_seed(seed)
    model = GPT(config)
    with torch.no_grad():
        for p in model.parameters():  # unique parameters: the tied token table is nudged once
            p.add_(nudge * torch.randn_like(p))
    torch.save({"model": model.state_dict(), "model_config": dataclasses.asdict(config), **extra}, path)
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


def varied_texts(n_random: int = 200) -> list[str]:
    """Text that is hard on a tokenizer: whitespace runs, contractions, numbers, scripts, emoji (with modifiers and
    joiners), controls, <|endoftext|> inside text; then random strings drawn from those kinds of code points."""
    texts = ["Hello world", " leading space", "trailing spaces   ", "   \n\n\n  \t\t x  y   z\n", "a\r\nb\rc",
             "I'm, you're; we'll: they've! He'd said 'quoted' \"double\" ''",
             "1234567890 3.14159 -42 1,000,000 2024-01-01", "emoji 😀👍🏽👨‍👩‍👧 flags 🇫🇷🇯🇵 ✓ ☃",
             "naïve café Ångström 日本語 한국어 العربية עברית Ελληνικά Русский",
             "zero\u200bwidth\u200djoiner \u00a0nbsp\u2003em\u3000ideographic\u0085nel\u2028ls",
             "\x00\x01\x7f controls",
             "<|endoftext|>", "a<|endoftext|>b", "text <|endoftext|> more<|endoftext|><|endoftext|>\n", "<|endoftext",
             "    def f(x):\n        return x ** 2  # code\n", "", " ", "\n"]
    pools = [range(0x20, 0x7F), range(0xA0, 0x250), range(0x370, 0x500), range(0x4E00, 0x4F00), range(0x1F300, 0x1F650),
             [0x9, 0xA, 0xD, 0x20, 0x20, 0x20, 0xA0, 0x85, 0x2009, 0x3000]]
    rng = random.Random(0)
    for _ in range(n_random):
        texts.append("".join(chr(rng.choice(rng.choice(pools))) for _ in range(rng.randrange(1, 80))))
    return texts


def greedy_text(model: GPT, ids: list[int], steps: int, vocab: int, enc) -> str:
    """What our model writes after ids, greedily, over the exported vocabulary: what the pipeline must write."""
    x = torch.tensor([ids])
    with torch.no_grad():
        for _ in range(steps):
            x = torch.cat([x, model(x)[0][:, -1, :vocab].argmax(-1, keepdim=True)], dim=1)
    return enc.decode(x[0].tolist())


def test_byte_symbols_are_gpt2s_printable_alphabet():
    symbols = export_hf.byte_symbols()
    assert len(set(symbols)) == 256
    assert all(symbols[b] == chr(b) for b in range(ord("!"), ord("~") + 1))
    assert (symbols[ord(" ")], symbols[ord("\n")]) == ("Ġ", "Ċ")  # as in GPT-2's "Ġthe"
    assert all(s.isprintable() and not s.isspace() for s in symbols)  # a merges.txt line splits at its one space


def test_bpe_merges_are_the_splits_bpe_makes():
    ranks = {bytes([b]): b for b in range(256)}
    ranks.update({b"ab": 256, b"bc": 257, b"abc": 258, b"abcbc": 259})
    # "abc" could be a + bc or ab + c; BPE merges ab first (it ranks lower), so it is made of ab + c
    assert export_hf.bpe_merges(ranks) == [(b"a", b"b"), (b"b", b"c"), (b"ab", b"c"), (b"abc", b"bc")]
    with pytest.raises(ValueError, match=r"b'xyz' \(rank 260\) is not a merge of two lower-ranked tokens"):
        export_hf.bpe_merges({**ranks, b"xyz": 260})
    with pytest.raises(ValueError, match="ranks 0..255 must be the single bytes"):
        export_hf.bpe_merges({**{bytes([b]): b for b in range(255)}, b"ab": 255})
    enc = fineweb.get_tokenizer()
    merges = export_hf.bpe_merges({token: enc.encode_single_token(token) for token in enc.token_byte_values()})
    assert len(merges) == 50000 and merges[:3] == [(b" ", b"t"), (b" ", b"a"), (b"h", b"e")]  # GPT-2's first three


def test_gpt2_export_tokenizes_as_we_do_and_generates(tmp_path):
    """AutoTokenizer on the export gives fineweb.get_tokenizer()'s ids on any text, <|endoftext|> included, and
    decodes back; so do tokenizer.json alone and vocab.json + merges.txt alone; the pipeline generates what our
    model generates; config.json has the run's dropout."""
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer, pipeline

    config = GPTConfig(block_size=32, vocab_size=50304, n_layer=1, n_head=2, n_embd=16, dropout=0.1)
    model = make_checkpoint(tmp_path / "ckpt.pt", config, nudge=0.5, tokenizer={"tokenizer": "gpt2", "vocab": None})
    out = export_hf.export_hf(tmp_path / "ckpt.pt", tmp_path / "hf")
    assert {p.name for p in out.iterdir()} == GPT2_FILES
    hf_config = json.loads((out / "config.json").read_text())
    assert [hf_config[k] for k in ("resid_pdrop", "embd_pdrop", "attn_pdrop")] == [0.1] * 3  # not HF's default
    assert (hf_config["vocab_size"], hf_config["bos_token_id"], hf_config["eos_token_id"]) == (50257, 50256, 50256)

    tok = AutoTokenizer.from_pretrained(out)
    assert (tok.bos_token_id, tok.eos_token_id, tok.unk_token_id, tok.model_max_length, len(tok)) == (
        50256, 50256, 50256, 32, 50257)
    enc = fineweb.get_tokenizer()
    plays = list(fineweb.iter_txt_documents(ROOT / "input.txt"))
    assert len(plays) == 8
    texts = varied_texts() + plays
    expected = [enc.encode(text, allowed_special="all") for text in texts]
    assert [tok(text)["input_ids"] for text in texts] == expected
    assert [tok.decode(ids) for ids in expected] == texts
    assert expected[texts.index("a<|endoftext|>b")] == [64, 50256, 65]  # the special token is one id
    # tokenizer.json alone (what GPT2TokenizerFast / PreTrainedTokenizerFast read), and vocab.json + merges.txt alone
    assert [e.ids for e in Tokenizer.from_file(str(out / "tokenizer.json")).encode_batch(texts)] == expected
    (tmp_path / "bpe").mkdir()
    for name in ("vocab.json", "merges.txt", "tokenizer_config.json", "config.json"):
        (tmp_path / "bpe" / name).write_bytes((out / name).read_bytes())
    assert AutoTokenizer.from_pretrained(tmp_path / "bpe")(texts)["input_ids"] == expected

    prompt = "Hello, I'm a language model,"
    [result] = pipeline("text-generation", model=str(out), device="cpu")(prompt, max_new_tokens=6, do_sample=False)
    assert len(result["generated_text"]) > len(prompt)
    assert result["generated_text"] == greedy_text(model, enc.encode(prompt), 6, 50257, enc)


def test_char_export_round_trips_the_plays_and_matches_our_logits(tmp_path):
    """A character-level checkpoint exports with a tokenizer whose id i is its i-th character: input.txt encodes to
    fineweb.CharTokenizer's ids and decodes back unchanged; the model computes our logits and loss; the pipeline
    writes what our model writes."""
    from transformers import AutoTokenizer, pipeline

    config = GPTConfig(block_size=16, vocab_size=len(CHARS), n_layer=2, n_head=2, n_embd=32)
    model = make_checkpoint(tmp_path / "ckpt.pt", config, nudge=0.3, tokenizer={"tokenizer": "char", "vocab": CHARS})
    export_hf.main([str(tmp_path / "ckpt.pt"), str(tmp_path / "hf")])  # the command line, in-process
    out = tmp_path / "hf"
    assert {p.name for p in out.iterdir()} >= {"config.json", "model.safetensors", "tokenizer.json",
                                               "tokenizer_config.json"}
    hf_config = json.loads((out / "config.json").read_text())
    assert hf_config["vocab_size"] == len(CHARS) == 77
    assert (hf_config["n_positions"], hf_config["n_ctx"], hf_config["n_embd"]) == (16, 16, 32)
    assert (hf_config["n_layer"], hf_config["n_head"], hf_config["activation_function"]) == (2, 2, "gelu_new")
    assert [hf_config[k] for k in ("resid_pdrop", "embd_pdrop", "attn_pdrop", "eos_token_id")] == [0.0] * 3 + [None]

    tok = AutoTokenizer.from_pretrained(out)
    chars = fineweb.CharTokenizer(CHARS)
    assert (len(tok), tok.model_max_length) == (77, 16)
    ids = tok(INPUT_TXT)["input_ids"]
    assert ids == chars.encode(INPUT_TXT)
    assert tok.decode(ids) == INPUT_TXT  # newlines, runs of spaces, punctuation: all as they were
    assert tok("  a\n\nb .")["input_ids"] == chars.encode("  a\n\nb .")
    with pytest.raises(Exception, match="UNK"):  # a character the model never saw is an error, as with ours
        tok("é")

    hf_logits, hf_loss, logits, loss = hf_and_our_outputs(out, model, 77, 16)
    torch.testing.assert_close(hf_logits, logits, atol=1e-5, rtol=0)
    torch.testing.assert_close(hf_loss, loss, atol=1e-5, rtol=0)
    prompt = "ROMEO:"
    [result] = pipeline("text-generation", model=str(out), device="cpu")(prompt, max_new_tokens=8, do_sample=False)
    assert result["generated_text"] == greedy_text(model, chars.encode(prompt), 8, 77, chars)
    assert len(result["generated_text"]) == len(prompt) + 8


@pytest.mark.parametrize("vocab_size, tokenizer, message", [
    (64, None, "the model has 64 token rows, fewer than the 50257 ids of the gpt2 tokenizer assumed (it records none)"),
    (64, {"tokenizer": "gpt2", "vocab": None}, "fewer than the 50257 ids of the gpt2 tokenizer it records"),
    (50, {"tokenizer": "char", "vocab": CHARS}, "has 50 token rows, fewer than the 77 ids of the char tokenizer"),
    (64, {"tokenizer": "sentencepiece"}, "manifest tokenizer 'sentencepiece': expected 'gpt2', or 'char'"),
    (64, {"tokenizer": "char", "vocab": "ba"}, "sorted, unique characters"),
    (64, "gpt2", "its 'tokenizer' entry is a str, not a dict"),
], ids=["gpt2 assumed", "gpt2 recorded", "char", "unknown", "unsorted chars", "not a dict"])
def test_export_without_a_tokenizer_that_fits_is_refused(tmp_path, vocab_size, tokenizer, message):
    extra = {} if tokenizer is None else {"tokenizer": tokenizer}
    make_checkpoint(tmp_path / "ckpt.pt", GPTConfig(block_size=8, vocab_size=vocab_size, n_layer=1, n_head=1, n_embd=8),
                    **extra)
    with pytest.raises(SystemExit) as exc:
        export_hf.main([str(tmp_path / "ckpt.pt"), str(tmp_path / "hf")])
    assert str(exc.value.code).startswith("export_hf.py: error: ") and message in str(exc.value.code)
    assert "\n" not in str(exc.value.code)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt.pt"]  # no directory, no temporary left


def test_model_only_export_for_callers_that_tokenise_themselves(tmp_path):
    """with_tokenizer=False (play.ipynb): the model alone, also when no known tokenizer fits its vocabulary."""
    config = GPTConfig(block_size=16, vocab_size=64, n_layer=2, n_head=2, n_embd=32)
    model = make_checkpoint(tmp_path / "ckpt.pt", config)
    out = export_hf.export_hf(tmp_path / "ckpt.pt", tmp_path / "hf", with_tokenizer=False)
    assert {p.name for p in out.iterdir()} == {"config.json", "generation_config.json", "model.safetensors"}
    hf_logits, _, logits, _ = hf_and_our_outputs(out, model, 64, 16)
    torch.testing.assert_close(hf_logits, logits, atol=1e-5, rtol=0)


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


def write_lm_eval_task(task_dir: Path, data: Path, name: str) -> Path:
    """A local lm-evaluation-harness task over HellaSwag-shaped jsonl: the context, then " " + each ending (the
    harness's default target_delimiter), scored by summed log-likelihood ("acc"). The json builder reads it offline."""
    task_dir.mkdir()
    (task_dir / f"{name}.yaml").write_text(textwrap.dedent(f"""\
        task: {name}
        dataset_path: json
        dataset_kwargs:
          data_files:
            validation: {json.dumps(str(data))}
        validation_split: validation
        output_type: multiple_choice
        doc_to_text: "{{{{ctx}}}}"
        doc_to_choice: endings
        doc_to_target: label
        metric_list:
          - metric: acc
        """))
    return task_dir


def test_lm_eval_harness_on_an_export_agrees_with_hellaswag_py(tmp_path):
    """lm-evaluation-harness (its `hf` model on the export) and hellaswag.py (our model on the checkpoint) pick the
    same ending of every example by summed log-likelihood, and agree on the log-likelihoods: two scorers, one answer."""
    lm_eval = pytest.importorskip("lm_eval", reason="lm-eval is in requirements.txt: pip install -r requirements.txt")
    from lm_eval.tasks import TaskManager

    import hellaswag

    # wide random weights: each ending gets a clearly different score, and the picks vary across examples
    config = GPTConfig(block_size=64, vocab_size=50304, n_layer=1, n_head=2, n_embd=32)
    model = make_checkpoint(tmp_path / "model_00010.pt", config, nudge=0.5, tokenizer={"tokenizer": "gpt2"})
    out = export_hf.export_hf(tmp_path / "model_00010.pt", tmp_path / "hf")
    data = write_hellaswag_jsonl(tmp_path / "tiny.jsonl")
    tasks = write_lm_eval_task(tmp_path / "tasks", data, "tiny_hellaswag")

    results = lm_eval.simple_evaluate(model="hf", model_args=f"pretrained={out}", tasks=["tiny_hellaswag"],
                                      task_manager=TaskManager(include_path=str(tasks), include_defaults=False),
                                      device="cpu", batch_size=8, log_samples=True)
    samples = sorted(results["samples"]["tiny_hellaswag"], key=lambda sample: sample["doc_id"])
    loglik = torch.tensor([[float(ll) for ll, _ in sample["filtered_resps"]] for sample in samples])  # (24, 4)
    theirs = loglik.argmax(1)
    assert [sample["acc"] for sample in samples] == [float(p == s["target"]) for p, s in zip(theirs.tolist(), samples)]

    examples = [json.loads(line) for line in data.read_text().splitlines()]
    sum_loss, _, labels = hellaswag.score_examples(model, examples, "cpu", enc=fineweb.get_tokenizer())
    ours = sum_loss.argmin(1)
    assert len(set(ours.tolist())) > 1  # the picks vary: agreeing on them means something
    assert torch.equal(theirs, ours)
    torch.testing.assert_close(loglik, -sum_loss, atol=1e-3, rtol=0)
    assert results["results"]["tiny_hellaswag"]["acc,none"] == pytest.approx((ours == labels).float().mean().item())
