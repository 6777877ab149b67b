"""export_hf.py: one of our checkpoints as a Hugging Face GPT-2 directory, tested with the tools
that read it, offline: transformers' Auto classes and pipeline, the tokenizers library and
lm-evaluation-harness. A model that GPT-2's format cannot hold is refused; bad input is one line
(through main(), in this process); a killed export's temporary directory is removed by the next.

<|endoftext|> in text: the exported tokenizer gives it its one id 50256, as tiktoken's
encode(text, allowed_special="all") does; with split_special_tokens=True it is text, as in
encode_ordinary (what hellaswag.py and fineweb.py use for document text)."""

import dataclasses
import json
import math
import os
import random
import signal
import types

import pytest
import torch
import torch.nn.functional as F
from conftest import (
    finish,
    main_error,
    no_position_table,
    one_line_error,
    run_main,
    run_with_stdout_closed,
    start,
    tiny_config,
    wait_for,
)

import export_hf
import fineweb
import harness
import hellaswag_eval
import train_gpt2

GPT2_FILES = {
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
}
SUBJECTS = ["The old king", "A young woman", "The river", "Our café", "Mr. Ōno", "The dog"]
VERBS = ["ran", "sang", "waited", "wrote", "slept", "laughed", "counted 12,345 coins"]
PLACES = ["by the sea", "in Paris", "under the bridge", "at 6 o'clock", "in 東京", "all night"]

pytestmark = pytest.mark.usefixtures("quiet_transformers")


def write_documents(path, n=40, seed=0):
    # n short documents of sentences, separated by two blank lines (fineweb.py's .txt format)
    rng = random.Random(seed)
    docs = []
    for i in range(n):
        sentences = []
        for _ in range(rng.randrange(3, 8)):
            words = [rng.choice(SUBJECTS), rng.choice(VERBS), rng.choice(PLACES)]
            sentences.append(" ".join(words) + rng.choice([".", "!", "?"]))
        docs.append(f"Story {i}\n\n" + " ".join(sentences))
    path.write_text("\n\n\n".join(docs) + "\n", encoding="utf-8")
    return docs


def nudge(model, std, seed=0):
    # move every weight well off its init (biases off 0, LayerNorms off 1, logits of some
    # units): a wrong mapping or a scorer's slip then shows
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(std * torch.randn(p.shape, generator=generator))
    return model


def char_checkpoint(path, chars, n_embd=32, seed=0, block_size=32, **choices):
    # a character-level checkpoint, made directly, with train_gpt2.GPT as it is now
    torch.manual_seed(seed)
    config = train_gpt2.GPTConfig(
        block_size=block_size, vocab_size=len(chars), n_layer=2, n_head=2, n_embd=n_embd, **choices
    )
    model = nudge(train_gpt2.GPT(config), 0.3, seed)
    ckpt = {
        "model": model.state_dict(),
        "model_config": dataclasses.asdict(config),
        "step": 0,
        "data": {"tokenizer": fineweb.tokenizer_info(fineweb.CharTokenizer(chars))},
    }
    harness.save_checkpoint(path, ckpt)
    return path


@pytest.fixture(scope="module")
def trained(gpt2_corpus, tmp_path_factory):
    # a real checkpoint: 2 steps of train_gpt2.py on a GPT-2 corpus of fineweb.py's, dropout 0.1
    log_dir = tmp_path_factory.mktemp("trained") / "log"
    cfg = tiny_config(gpt2_corpus, log_dir, seq_len=32, max_steps=2, dropout=0.1)
    train_gpt2.train(cfg, log=lambda *a: None)
    return log_dir / "model_00002.pt"


@pytest.fixture(scope="module")
def nudged(trained):
    # the trained checkpoint, its weights nudged (2 steps leave them at their init)
    ckpt = harness.read_checkpoint(trained)
    model, _ = train_gpt2.load_model(trained)
    ckpt["model"] = nudge(model, 0.5).state_dict()
    path = trained.with_name("nudged.pt")
    harness.save_checkpoint(path, ckpt)
    return path


@pytest.fixture(scope="module")
def exported(nudged):
    # (beside the run's log_dir: no program writes into another's)
    return export_hf.export_hf(nudged, nudged.parent.parent / "hf")


@pytest.fixture(scope="module")
def ours(nudged):
    model, enc = train_gpt2.load_model(nudged)
    return model.eval(), enc


def varied_texts(n_random=100):
    # hard on a tokenizer: whitespace runs, contractions, numbers, scripts, emoji, controls,
    # <|endoftext|> inside text; then random strings of such characters
    texts = [
        "Hello world",
        " leading space",
        "trailing spaces   ",
        "   \n\n\n  \t\t x  y   z\n",
        "a\r\nb\rc",
        "I'm, you're; we'll: they've! He'd said 'quoted' \"double\" ''",
        "1234567890 3.14159 -42 1,000,000 2024-01-01",
        "emoji 😀👍🏽👨‍👩‍👧 flags 🇫🇷🇯🇵 ✓ ☃",
        "naïve café Ångström 日本語 한국어 العربية עברית Ελληνικά Русский",
        "zero\u200bwidth\u200djoiner \u00a0nbsp\u2003em\u3000ideographic\u0085nel\u2028ls",
        "\x00\x01\x7f controls",
        "<|endoftext|>",
        "a<|endoftext|>b",
        "text <|endoftext|> more<|endoftext|><|endoftext|>\n",
        "<|endoftext",
        "    def f(x):\n        return x ** 2  # code\n",
        "",
        " ",
        "\n",
    ]
    pools = [
        range(0x20, 0x7F),
        range(0xA0, 0x250),
        range(0x370, 0x500),
        range(0x4E00, 0x4F00),
        range(0x1F300, 0x1F650),
        [0x9, 0xA, 0xD, 0x20, 0x20, 0x20, 0xA0, 0x85, 0x2009, 0x3000],
    ]
    rng = random.Random(0)
    for _ in range(n_random):
        length = rng.randrange(1, 80)
        texts.append("".join(chr(rng.choice(rng.choice(pools))) for _ in range(length)))
    return texts


@pytest.mark.gpt2_contract
def test_export_computes_our_logits(exported, ours, tmp_path):
    from transformers import AutoModelForCausalLM

    assert {p.name for p in exported.iterdir()} == GPT2_FILES
    config = json.loads((exported / "config.json").read_text())
    shape = [config[k] for k in ("vocab_size", "n_positions", "n_embd", "n_layer", "n_head")]
    assert shape == [50257, 32, 32, 2, 2]  # 50304 -> 50257: the padding rows are gone
    assert [config[k] for k in ("resid_pdrop", "embd_pdrop", "attn_pdrop")] == [0.1] * 3
    assert config["activation_function"] == "gelu_new" and config["tie_word_embeddings"]
    assert (config["bos_token_id"], config["eos_token_id"]) == (50256, 50256)

    model, enc = ours
    hf = AutoModelForCausalLM.from_pretrained(exported).eval()
    text = write_documents(tmp_path / "docs.txt", seed=1)[0]
    x = torch.tensor([enc.encode(text)[:32], enc.encode(text)[-32:]])  # (2, 32)
    with torch.no_grad():
        out = hf(x, labels=x)  # transformers shifts the labels itself
        logits = model(x)[0][..., :50257]
    loss = F.cross_entropy(logits[:, :-1].flatten(0, 1), x[:, 1:].flatten())
    assert logits.abs().max() > 5  # wide logits: a small slip would show
    torch.testing.assert_close(out.logits, logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out.loss, loss, atol=1e-5, rtol=1e-5)


@pytest.mark.gpt2_contract
def test_a_killed_export_leaves_a_temporary_that_the_next_removes(trained, tmp_path):
    # the command line, as a user runs it, killed outright (kill -9: no cleanup) while it writes
    out = tmp_path / "hf"
    tmp = tmp_path / ".hf.tmp"
    proc = start("export_hf.py", [trained, out])
    wait_for(lambda: (tmp / "model.safetensors").exists(), proc)
    proc.send_signal(signal.SIGKILL)
    code, _, _ = finish(proc)
    assert code == -signal.SIGKILL
    assert [p.name for p in tmp_path.iterdir()] == [".hf.tmp"]
    # The next export to the same OUT_DIR starts by removing it, and leaves only OUT_DIR. Its
    # reader gone first (`export_hf.py ... | head`), it ends quietly: exit 0, no BrokenPipeError.
    returncode, err = run_with_stdout_closed("export_hf.py", [trained, out])
    assert returncode == 0 and err == "", err[-2000:]
    assert [p.name for p in tmp_path.iterdir()] == ["hf"]
    assert {p.name for p in out.iterdir()} == GPT2_FILES
    # a directory of that name that no export made is the user's: refused, kept
    mine = tmp_path / ".hf2.tmp"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    message = main_error(export_hf.main, [trained, tmp_path / "hf2"])
    assert message.startswith(
        f"export_hf.py: error: {mine} is in the way and is not export_hf.py's"
    )
    assert (mine / "notes.txt").read_text() == "keep me" and not (tmp_path / "hf2").exists()


@pytest.mark.gpt2_contract
def test_tokenizer_gives_tiktokens_ids(exported, tmp_path):
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(exported)
    special = (tok.bos_token_id, tok.eos_token_id, tok.unk_token_id)
    assert special == (50256, 50256, 50256)
    assert (len(tok), tok.model_max_length) == (50257, 32)
    enc = fineweb.get_tokenizer()
    texts = varied_texts() + write_documents(tmp_path / "docs.txt", n=10)
    expected = [enc.encode(text, allowed_special="all") for text in texts]
    assert [tok(text)["input_ids"] for text in texts] == expected
    assert [tok.decode(ids) for ids in expected] == texts
    assert tok("a<|endoftext|>b")["input_ids"] == [64, 50256, 65]
    # split_special_tokens: <|endoftext|> is text, as in encode_ordinary
    ordinary = [enc.encode_ordinary(text) for text in texts]
    assert tok(texts, split_special_tokens=True)["input_ids"] == ordinary
    # tokenizer.json alone, for the tokenizers library
    alone = Tokenizer.from_file(str(exported / "tokenizer.json"))
    assert [e.ids for e in alone.encode_batch(texts)] == expected


@pytest.mark.gpt2_contract
def test_pipeline_generates_what_our_model_generates(exported, ours):
    from transformers import pipeline

    model, enc = ours
    prompt = "The old king sang"
    generate = pipeline("text-generation", model=str(exported), device="cpu")
    [result] = generate(prompt, max_new_tokens=8, do_sample=False)
    idx = torch.tensor([enc.encode(prompt)])
    greedy = model.generate(idx, 8, temperature=0, vocab_limit=50257)
    assert result["generated_text"] == enc.decode(greedy[0].tolist())
    assert len(greedy[0]) == len(idx[0]) + 8


def hellaswag_examples(n=12, seed=0):
    # HellaSwag-shaped examples: a context, 4 endings, a label
    rng = random.Random(seed)
    examples = []
    for _ in range(n):
        ctx = f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(PLACES)}. Then it"
        endings = [f"{rng.choice(VERBS)} {rng.choice(PLACES)}." for _ in range(4)]
        examples.append({"ctx": ctx, "endings": endings, "label": rng.randrange(4)})
    return examples


@pytest.mark.gpt2_contract
def test_lm_eval_picks_what_hellaswag_py_picks(exported, ours):
    # lm-evaluation-harness's `hf` model (HFLM) on the export and hellaswag.py's evaluate() on
    # our model pick the same ending of each example by summed log-likelihood (acc). HFLM is
    # driven directly: its own hellaswag task rewrites the text, so both score the same
    # contexts and continuations here (context, " " + ending).
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM

    examples = hellaswag_examples()
    lm = HFLM(pretrained=str(exported), device="cpu", batch_size=16)
    requests = []
    for i, ex in enumerate(examples):
        for ending in ex["endings"]:
            args = (ex["ctx"], " " + ending)
            requests.append(Instance("loglikelihood", ex, args, len(requests)))
    loglik = torch.tensor([ll for ll, _ in lm.loglikelihood(requests, disable_tqdm=True)])
    theirs = loglik.view(-1, 4).argmax(dim=1).tolist()

    # evaluate()'s acc of one example labelled j is 1 where j is its pick
    model, enc = ours
    picks = []
    for ex in examples:
        accs = []
        for j in range(4):
            prepared = hellaswag_eval.prepare([{**ex, "label": j}], enc, model.config.block_size)
            accs.append(hellaswag_eval.evaluate(model, prepared, "cpu")["acc"])
        assert sorted(accs) == [0, 0, 0, 1]
        picks.append(accs.index(1))
    assert len(set(picks)) > 1  # the picks vary: agreeing on them means something
    assert theirs == picks
    prepared = hellaswag_eval.prepare(examples, enc, model.config.block_size)
    right = sum(p == ex["label"] for p, ex in zip(theirs, examples))
    assert hellaswag_eval.evaluate(model, prepared, "cpu")["acc"] == right / len(examples)


@pytest.mark.gpt2_contract
def test_char_checkpoint_exports_a_character_tokenizer(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer, pipeline

    docs = write_documents(tmp_path / "docs.txt")
    text = "\n\n\n".join(docs)
    chars = "".join(sorted(set(text)))
    ckpt = char_checkpoint(tmp_path / "model_00000.pt", chars)
    model, enc = train_gpt2.load_model(ckpt)
    out = export_hf.export_hf(ckpt, tmp_path / "hf")

    tok = AutoTokenizer.from_pretrained(out)
    assert (len(tok), tok.model_max_length) == (len(chars), 32)
    ids = tok(text)["input_ids"]
    assert ids == enc.encode(text)
    assert tok.decode(ids) == text  # newlines, runs of spaces, punctuation as they were
    with pytest.raises(Exception):  # a character the model never saw is an error, as with ours
        tok("ü")

    hf = AutoModelForCausalLM.from_pretrained(out).eval()
    assert hf.config.vocab_size == len(chars) and hf.config.eos_token_id is None
    x = torch.tensor([ids[:32], ids[100:132]])  # (2, 32)
    with torch.no_grad():
        torch.testing.assert_close(hf(x).logits, model.eval()(x)[0], atol=1e-5, rtol=1e-5)
    prompt = "Story 3\n\n"
    generate = pipeline("text-generation", model=str(out), device="cpu")
    [result] = generate(prompt, max_new_tokens=10, do_sample=False)
    greedy = model.generate(torch.tensor([enc.encode(prompt)]), 10, temperature=0)
    assert result["generated_text"] == enc.decode(greedy[0].tolist())


@pytest.mark.gpt2_contract
def test_nanogpts_choices_export_as_gpt2_and_load_back(tmp_path):
    # no biases (GPT-2's of zero) and the exact GELU (transformers' "gelu"), both ways
    from transformers import AutoModelForCausalLM

    chars = "\n abcdefghij"  # (sorted)
    choices = {"bias": False, "gelu_approximate": "none"}
    ckpt = char_checkpoint(tmp_path / "model_00000.pt", chars, **choices)
    model, _ = train_gpt2.load_model(ckpt)
    assert not [name for name, _ in model.named_parameters() if name.endswith(".bias")]
    out = export_hf.export_hf(ckpt, tmp_path / "hf")
    hf = AutoModelForCausalLM.from_pretrained(out).eval()
    assert hf.config.activation_function == "gelu"
    x = torch.randint(0, len(chars), (2, 32), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits = model.eval()(x)[0]
        torch.testing.assert_close(hf(x).logits, logits, atol=1e-5, rtol=1e-5)
        back = train_gpt2.GPT.from_pretrained(str(out)).eval()
        assert back.config.gelu_approximate == "none"
        torch.testing.assert_close(back(x)[0], logits, atol=1e-5, rtol=1e-5)


def untied(monkeypatch):
    # the head gets its own weights
    class Untied(train_gpt2.GPT):
        def __init__(self, config):
            super().__init__(config)
            self.lm_head.weight = torch.nn.Parameter(self.lm_head.weight.detach().clone())

    monkeypatch.setattr(train_gpt2, "GPT", Untied)


def erf_gelu(monkeypatch):
    # the exact GELU instead of GPT-2's tanh approximation
    def forward(self, x):
        return self.dropout(self.c_proj(F.gelu(self.c_fc(x))))

    monkeypatch.setattr(train_gpt2.MLP, "forward", forward)


def soft_capped(cap):
    # logits soft-capped at `cap` (cap x tanh(logits / cap)), as some newer models do
    def edit(monkeypatch):
        forward = train_gpt2.GPT.forward

        def capped(self, *args, **kwargs):
            logits, loss = forward(self, *args, **kwargs)
            return cap * torch.tanh(logits / cap), loss

        monkeypatch.setattr(train_gpt2.GPT, "forward", capped)

    return edit


def test_older_checkpoints_load_with_their_dropout(tmp_path):
    # an older checkpoint's config: a field this code does not have (its weights are the same),
    # none of the fields added since (their defaults built what it holds)
    ckpt = harness.read_checkpoint(char_checkpoint(tmp_path / "model_00000.pt", "abc"))
    del ckpt["model_config"]["gelu_approximate"]
    ckpt["model_config"].update(flash=True, dropout=0.1)
    harness.save_checkpoint(tmp_path / "old.pt", ckpt)
    model, enc = export_hf.load(tmp_path / "old.pt")
    assert model.config.dropout == 0.1 and not model.training and enc.chars == "abc"


def make_inputs(root):
    """The files of the bad inputs: a character checkpoint made with train_gpt2.GPT as it is
    now, a torn one, other programs' files, checkpoints missing a part, OUT_DIRs in use."""
    ckpt = char_checkpoint(root / "model.pt", "\n abcdefghij", n_embd=64)
    (root / "torn.pt").write_bytes(ckpt.read_bytes()[:-1000])
    (root / "text.pt").write_text("not a checkpoint\n")
    torch.save([1, 2, 3], root / "list.pt")
    torch.save({"model": {}, "model_config": [2], "step": 0}, root / "foreign.pt")
    saved = harness.read_checkpoint(ckpt)
    del saved["data"]["tokenizer"]
    harness.save_checkpoint(root / "no_tokenizer.pt", saved)
    saved = harness.read_checkpoint(char_checkpoint(root / "small_table.pt", "abc"))
    saved["data"]["tokenizer"] = fineweb.tokenizer_info(fineweb.CharTokenizer("abcd"))
    harness.save_checkpoint(root / "small_table.pt", saved)
    (root / "full").mkdir()
    (root / "full" / "mine.txt").write_text("keep me")
    (root / "a_file").write_text("keep me")
    (root / "run").mkdir()
    (root / "run" / "runs.jsonl").write_text("{}\n")
    # what a read would wait on for ever, and a run that diverged (a NaN among its weights)
    os.mkfifo(root / "fifo.pt")
    os.mkfifo(root / "fifo_out")
    saved = harness.read_checkpoint(ckpt)
    saved["model"]["transformer.h.1.mlp.c_proj.weight"][4, 2] = math.inf
    harness.save_checkpoint(root / "nan.pt", saved)


# name: (an edit of train_gpt2 as a user might make it, or None; the arguments; the message)
BAD_INPUTS = {
    "no arguments": (None, [], "the following arguments are required: checkpoint, out_dir"),
    "missing checkpoint": (None, ["{root}/none.pt", "{root}/out"], "cannot read checkpoint"),
    "torn checkpoint": (None, ["{root}/torn.pt", "{root}/out"], "damaged, or not a checkpoint"),
    "a text file": (None, ["{root}/text.pt", "{root}/out"], "damaged, or not a checkpoint"),
    "a list": (None, ["{root}/list.pt", "{root}/out"], "list.pt is not a train_gpt2.py checkpoint"),
    "another program's": (
        None,
        ["{root}/foreign.pt", "{root}/out"],
        "foreign.pt is not a checkpoint of train_gpt2.py's GPT",
    ),
    "no tokenizer": (
        None,
        ["{root}/no_tokenizer.pt", "{root}/out"],
        "no_tokenizer.pt is not a checkpoint of train_gpt2.py's GPT",
    ),
    "a small token table": (
        None,
        ["{root}/small_table.pt", "{root}/out"],
        "small_table.pt: fewer token rows than its tokenizer's ids",
    ),
    "OUT_DIR not empty": (
        None,
        ["{root}/model.pt", "{root}/full"],
        "full exists and is not an empty directory; pick a new OUT_DIR",
    ),
    "OUT_DIR a file": (None, ["{root}/model.pt", "{root}/a_file"], "a_file exists and is not"),
    "OUT_DIR a FIFO": (None, ["{root}/model.pt", "{root}/fifo_out"], "fifo_out exists and is not"),
    "OUT_DIR in a file": (
        None,
        ["{root}/model.pt", "{root}/a_file/out"],
        "cannot write {root}/a_file/out: Not a directory",
    ),
    "OUT_DIR in a run's log_dir": (
        None,
        ["{root}/model.pt", "{root}/run/hf"],
        "{root}/run/hf is inside the run in {root}/run: pick an OUT_DIR outside it",
    ),
    "a FIFO checkpoint": (
        None,
        ["{root}/fifo.pt", "{root}/out"],
        "cannot read checkpoint {root}/fifo.pt (not a regular file)",
    ),
    "a diverged checkpoint": (
        None,
        ["{root}/nan.pt", "{root}/out"],
        "nan.pt holds non-finite weights (first: transformer.h.1.mlp.c_proj.weight): its run"
        " diverged before it was saved; use an earlier checkpoint",
    ),
    "an untied head": (untied, ["{root}/model.pt", "{root}/out"], "GPT-2's format cannot hold"),
    "the exact GELU": (erf_gelu, ["{root}/model.pt", "{root}/out"], "GPT-2's format cannot hold"),
    "capped logits": (soft_capped(5), ["{root}/model.pt", "{root}/out"], "GPT-2's format cannot"),
    # (the first weight named is the fork's own where it differs more: QK-norm's k_norm)
    "no position table": (
        no_position_table,
        ["{root}/model.pt", "{root}/out"],
        "GPT-2's format cannot hold this model: transformer.",
    ),
}
# an export that gets as far as writing: only a model GPT-2's format holds
WRITES = {"OUT_DIR in a file"}


def test_an_edit_seen_only_at_distant_positions_is_refused(tmp_path, capsys, monkeypatch):
    # Sliding-window attention over the last 64 positions: its logits are GPT-2's at the first
    # 64 positions, so only a check over the whole context (96) sees that GPT-2 differs.
    sdpa = F.scaled_dot_product_attention

    def windowed(q, k, v, attn_mask=None, is_causal=False, dropout_p=0.0, **options):
        # (options: any other of SDPA's, which an edit may pass: enable_gqa, scale)
        T, S = q.size(-2), k.size(-2)  # queries, keys (the last T of them are the queries')
        mask = torch.ones(T, S, dtype=torch.bool).tril(S - T).triu(S - T - 63)
        return sdpa(q, k, v, attn_mask=mask, dropout_p=dropout_p, **options)

    functional = types.SimpleNamespace(**{**vars(F), "scaled_dot_product_attention": windowed})
    monkeypatch.setattr(train_gpt2, "F", functional)
    checkpoint = char_checkpoint(tmp_path / "model.pt", "abcdefgh", block_size=96)
    code, err = run_main(export_hf.main, [checkpoint, tmp_path / "out"], capsys)
    one_line_error(code, err, "export_hf.py", "GPT-2's format cannot hold this model")
    assert not (tmp_path / "out").exists()


def test_an_edit_that_a_young_models_small_logits_hide_is_refused(
    trained, tmp_path, capsys, monkeypatch, quiet_transformers
):
    # Gemma 2's soft cap, 30 x tanh(logits / 30): two steps from the init the logits are far
    # below 30, where the cap is all but the identity (it moves a logit of 0.5 by 4e-5), so the
    # checkpoint's own weights cannot show it; the export is refused all the same
    soft_capped(30)(monkeypatch)
    code, err = run_main(export_hf.main, [trained, tmp_path / "out"], capsys)
    one_line_error(code, err, "export_hf.py", "GPT-2's format cannot hold this model")
    assert not (tmp_path / "out").exists()


# a FIFO opened would block for good: the timeout fails the test rather than hang
@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "name",
    [pytest.param(n, marks=pytest.mark.gpt2_contract) if n in WRITES else n for n in BAD_INPUTS],
)
def test_bad_input_is_one_line(tmp_path, capsys, monkeypatch, name):
    edit, args, message = BAD_INPUTS[name]
    # train_gpt2.GPT edited before its checkpoint is made: it loads, but the exported model
    # would compute other logits
    if edit is not None:
        edit(monkeypatch)
        # what a killed export to the same OUT_DIR left: removed by this one before it writes
        (tmp_path / ".out.tmp").mkdir()
        (tmp_path / ".out.tmp" / export_hf.MARK).touch()
        (tmp_path / ".out.tmp" / "model.safetensors").write_bytes(b"torn")
    make_inputs(tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir() if p.name != ".out.tmp")
    code, err = run_main(export_hf.main, [a.format(root=tmp_path) for a in args], capsys)
    one_line_error(code, err, "export_hf.py", message.format(root=tmp_path))
    # nothing written, nothing of the user's changed
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    assert (tmp_path / "full" / "mine.txt").read_text() == "keep me"
    assert (tmp_path / "a_file").read_text() == "keep me"
