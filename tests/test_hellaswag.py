"""hellaswag_eval.py and hellaswag.py: rendering, the batched scoring (the same picks as each
example's 4 rows scored alone, batches rounded up to a few widths), DDP striding over 2 gloo
processes, the results kept on the device, the data readers, the hub download from an offline
cache, and the command line: one real process on a checkpoint, and every bad input (data, model,
flags) one line on stderr through main(). The model of the scoring tests is a tiny causal LM
defined here."""

import copy
import hashlib
import json
import os
import random
import sys
import warnings
from pathlib import Path
from types import SimpleNamespace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from conftest import (
    cases,
    finish,
    one_line_error,
    run_main,
    run_with_stdout_closed,
    start,
)

import harness
import hellaswag
import hellaswag_eval
import train_gpt2
from fineweb import get_tokenizer

# under pytest -n N --dist loadgroup: one worker, so the module's fixtures are made once
pytestmark = pytest.mark.xdist_group("hellaswag")
ROOT = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent
N_EXAMPLES = 21  # odd: the 2 DDP ranks score 11 and 10
WORDS = (
    "the a man woman dog cat ball house runs jumps quickly slowly red blue under over river "
    "mountain cooks paints guitar plays water fire tree green small large bright dark opens closes "
    "window door kitchen knife bread slices carefully then finally begins stops laughs sings"
).split()


class TinyLM(nn.Module):
    """A small causal LM with the interface evaluate() takes: model(idx) -> (logits (N, L, V),
    None), .config.block_size and .config.vocab_size. The vocabulary is padded past GPT-2's
    50257 ids, like our GPT's 50304. It records (training, grad enabled, autocast enabled) and
    the width L of every call."""

    def __init__(self, vocab_size=50304, block_size=64, dim=16, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.config = SimpleNamespace(block_size=block_size, vocab_size=vocab_size)
        self.wte = nn.Embedding(vocab_size, dim)
        self.wpe = nn.Embedding(block_size, dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.head = nn.Linear(dim, vocab_size)
        self.calls = []
        self.widths = []

    def forward(self, idx):
        autocast = torch.is_autocast_enabled(idx.device.type)
        self.calls.append((self.training, torch.is_grad_enabled(), autocast))
        self.widths.append(idx.size(1))
        pos = torch.arange(idx.size(1), device=idx.device)
        x = self.wte(idx) + self.wpe(pos)  # (N, L, C)
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        # causal: a row's padding on the right changes nothing before it
        x = x + F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return 2.0 * self.head(x), None


def synthetic_examples(n, seed=0):
    """Random-word examples with contexts and endings of different lengths: rows of about 5 to
    45 tokens, so that batches take more than one width."""
    rng = random.Random(seed)

    def words(lo, hi):
        return " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))

    examples = []
    for _ in range(n):
        endings = []
        # 4 different endings: two alike would tie
        while len(endings) < 4:
            ending = words(1, 8) + "."
            if ending not in endings:
                endings.append(ending)
        label = rng.randrange(4)
        examples.append({"ctx": words(3, 30).capitalize(), "endings": endings, "label": label})
    return examples


def rowanz(examples):
    """The examples as rowanz's .jsonl lines, with their other keys."""
    lines = []
    for i, ex in enumerate(examples):
        row = {"ind": i, "activity_label": "Cooking", "ctx_a": ex["ctx"], "ctx_b": "", **ex}
        lines.append(json.dumps({**row, "split": "val", "split_type": "indomain"}))
    return "\n".join(lines) + "\n"


def write_hf_parquet(path, examples):
    """The examples as the hub's parquet conversion keeps them: every column, the label a string."""
    table = pa.table(
        {
            "ind": list(range(len(examples))),
            "activity_label": ["Cooking"] * len(examples),
            "ctx_a": [ex["ctx"] for ex in examples],
            "ctx_b": [""] * len(examples),
            "ctx": [ex["ctx"] for ex in examples],
            "endings": [ex["endings"] for ex in examples],
            "source_id": ["activitynet~v_x"] * len(examples),
            "split": ["val"] * len(examples),
            "split_type": ["indomain"] * len(examples),
            "label": [str(ex["label"]) for ex in examples],
        }
    )
    pq.write_table(table, path)
    return path


def scored_alone(model, example, enc):
    """(sum (4,), mean (4,)) losses of one example's 4 rows scored by themselves, written out
    independently: log-softmax over GPT-2's ids only, each ending token's log-probability read
    from the position before it."""
    tokens, mask, _ = hellaswag_eval.render_example(example, enc)
    with torch.no_grad():
        logits, _ = model(tokens)  # (4, L, V)
    logp = logits[..., : enc.n_vocab].log_softmax(dim=-1)
    sums = []
    for r in range(4):
        ending = [t for t in range(tokens.size(1)) if mask[r, t]]
        sums.append(-sum(logp[r, t - 1, tokens[r, t]] for t in ending))
    sums = torch.stack(sums)
    return sums, sums / mask.sum(dim=1)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models only lose to a second thread; one thread also keeps the runs comparable."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="module")
def enc():
    return get_tokenizer()


@pytest.fixture(scope="module")
def examples():
    return synthetic_examples(N_EXAMPLES)


@pytest.fixture(scope="module")
def model():
    return TinyLM().eval()


@pytest.fixture(scope="module")
def prepared(examples, enc, model):
    return hellaswag_eval.prepare(examples, enc, model.config.block_size)


@pytest.fixture(scope="module")
def few(examples, enc, model):
    """The first 8 examples prepared: for the tests that need no more."""
    return hellaswag_eval.prepare(examples[:8], enc, model.config.block_size)


@pytest.fixture(scope="module")
def alone(model, examples, enc):
    """Every example scored by itself: (sums (n, 4), means (n, 4))."""
    scores = [scored_alone(model, ex, enc) for ex in examples]
    return torch.stack([s for s, _ in scores]), torch.stack([m for _, m in scores])


# ----------------------------------------------------------------------------------------------
# rendering


def test_render_example_rows_mask_and_padding(enc):
    example = {
        "ctx": "A man is sitting on a roof. He",
        "endings": ["is using wrap.", "starts pulling up roofing on a roof.", "x", "sits."],
        "label": 3,
    }
    tokens, mask, label = hellaswag_eval.render_example(example, enc)
    ctx = enc.encode_ordinary(example["ctx"])
    ends = [enc.encode_ordinary(" " + e) for e in example["endings"]]
    width = len(ctx) + max(map(len, ends))
    assert label == 3
    assert tokens.shape == mask.shape == (4, width)
    assert tokens.dtype == mask.dtype == torch.long
    for i, end in enumerate(ends):
        pad = [0] * (width - len(ctx) - len(end))
        assert tokens[i].tolist() == ctx + end + pad
        assert mask[i].tolist() == [0] * len(ctx) + [1] * len(end) + pad
    assert len(set(map(len, ends))) > 1  # the padding was exercised


def test_text_spelling_the_special_token_stays_text(enc):
    example = {"ctx": "He wrote <|endoftext|> on", "endings": ["it"] * 4, "label": 0}
    tokens, _, _ = hellaswag_eval.render_example(example, enc)
    assert enc.eot_token not in tokens.flatten().tolist()


def test_prepare_lays_out_rows_shortest_first(prepared, examples, enc):
    n = len(examples)
    assert prepared["tokens"].size(0) == prepared["start"].size(0) == 4 * n
    assert prepared["labels"].tolist() == [ex["label"] for ex in examples]
    assert prepared["n_vocab"] == enc.n_vocab
    # row 4 * i + j is example i's ending j, as render_example has it
    tokens, mask, _ = hellaswag_eval.render_example(examples[5], enc)
    width = tokens.size(1)
    assert torch.equal(prepared["tokens"][20:24, :width], tokens)
    assert not prepared["tokens"][20:24, width:].any()
    for j in range(4):
        start = int(prepared["start"][20 + j])
        count = int(prepared["count"][20 + j])
        assert mask[j].tolist() == [0] * start + [1] * count + [0] * (width - start - count)
    length = (prepared["start"] + prepared["count"])[prepared["order"]]
    assert length.tolist() == sorted(length.tolist())


def test_prepare_refuses_what_cannot_be_scored(examples, enc):
    empty = {"ctx": "", "endings": ["a", "b", "c", "d"], "label": 0}
    with pytest.raises(ValueError) as info:
        hellaswag_eval.prepare(examples[:2] + [empty], enc, 64)
    assert str(info.value) == "example 2: the context is empty"
    long = {"ctx": " ".join(["He runs."] * 30), "endings": ["a", "b", "c", "a b"], "label": 0}
    n = len(enc.encode_ordinary(long["ctx"] + " a b"))
    with pytest.raises(ValueError) as info:
        hellaswag_eval.prepare(examples[:2] + [long], enc, 64)
    message = f"example 2: context + ending is {n} tokens, more than block_size 64"
    assert str(info.value) == message
    assert hellaswag_eval.prepare([long], enc, n)["tokens"].size(1) == n


# ----------------------------------------------------------------------------------------------
# scoring


def test_batched_picks_are_those_of_each_example_alone(model, prepared, alone, examples):
    ref_sum, ref_mean = alone
    picks = ref_sum.argmin(dim=1)
    picks_norm = ref_mean.argmin(dim=1)
    # the test has teeth: varied picks, acc and acc_norm disagree, no near-ties
    assert len(set(picks.tolist())) == 4
    assert (picks != picks_norm).any()
    for losses in alone:
        top2 = losses.topk(2, dim=1, largest=False).values
        assert (top2[:, 1] - top2[:, 0]).min() > 1e-3
    # 1 row a batch, 7 (examples split over batches), all in one batch
    for batch_rows in (1, 7, 1000):
        sums, means = hellaswag_eval.ending_losses(model, prepared, "cpu", batch_rows=batch_rows)
        assert torch.equal(sums.argmin(dim=1), picks), batch_rows
        assert torch.equal(means.argmin(dim=1), picks_norm), batch_rows
        torch.testing.assert_close(sums, ref_sum, rtol=0, atol=1e-4)
        torch.testing.assert_close(means, ref_mean, rtol=0, atol=1e-4)
    labels = torch.tensor([ex["label"] for ex in examples])
    result = hellaswag_eval.evaluate(model, prepared, "cpu", batch_rows=7)
    assert result == {
        "n": N_EXAMPLES,
        "acc": (picks == labels).sum().item() / N_EXAMPLES,
        "acc_norm": (picks_norm == labels).sum().item() / N_EXAMPLES,
    }
    assert 0 < result["acc"] < 1 and 0 < result["acc_norm"] < 1


def test_batches_take_a_few_widths(model, prepared):
    """Each batch's width is its longest row rounded up to WIDTH_STEP (within the longest row of
    all): on a GPU each width builds its own attention kernels."""
    length = (prepared["start"] + prepared["count"])[prepared["order"]].tolist()
    longest = prepared["tokens"].size(1)
    assert len(set(length)) > 10 and longest > hellaswag_eval.WIDTH_STEP  # widths to round
    model.widths.clear()
    hellaswag_eval.ending_losses(model, prepared, "cpu", batch_rows=4)
    step = hellaswag_eval.WIDTH_STEP
    for first, width in zip(range(0, len(length), 4), model.widths):
        batch = max(length[first : first + 4])
        assert width == min(-(-batch // step) * step, longest), (batch, width)
    assert set(model.widths) == {step, longest}


def test_padded_vocabulary_ids_are_left_out_of_the_softmax(model, few, enc):
    """A model whose extra (padding) ids get huge logits scores like one without those ids."""
    padded = copy.deepcopy(model)
    with torch.no_grad():
        padded.head.bias[enc.n_vocab :] = 50.0
    trimmed = TinyLM(vocab_size=enc.n_vocab)
    state = {
        k: v[: enc.n_vocab] if k.startswith(("head", "wte")) else v
        for k, v in model.state_dict().items()
    }
    trimmed.load_state_dict(state)
    a = hellaswag_eval.ending_losses(padded, few, "cpu")
    b = hellaswag_eval.ending_losses(trimmed, few, "cpu")
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y, rtol=0, atol=1e-4)


def test_rank_scores_every_world_size_th_example(model, prepared, alone):
    sums, means = hellaswag_eval.ending_losses(model, prepared, "cpu", rank=1, world_size=3)
    assert sums.shape == (len(range(1, N_EXAMPLES, 3)), 4)
    torch.testing.assert_close(sums, alone[0][1::3], rtol=0, atol=1e-4)
    torch.testing.assert_close(means, alone[1][1::3], rtol=0, atol=1e-4)


def test_eval_mode_no_grad_autocast_and_the_mode_restored(model, few):
    model.train()
    model.calls.clear()
    hellaswag_eval.evaluate(model, few, "cpu")
    assert model.training
    assert model.calls and set(model.calls) == {(False, False, False)}
    model.calls.clear()
    result = hellaswag_eval.evaluate(model, few, "cpu", autocast_dtype=torch.bfloat16)
    assert set(model.calls) == {(False, False, True)}
    assert result["n"] == 8 and 0 <= result["acc_norm"] <= 1

    class Broken(TinyLM):
        def forward(self, idx):
            raise RuntimeError("out of memory")

    broken = Broken().train()
    with pytest.raises(RuntimeError):
        hellaswag_eval.evaluate(broken, few, "cpu")
    assert broken.training
    model.eval()


def test_results_stay_on_the_device_until_one_sync_at_the_end(model, few, monkeypatch):
    """Every way a tensor's value reaches Python is counted: the same with 8 batches as with one
    (the batch plan read from the CPU tensors, and the final counts), none per batch."""
    seen = []

    def counting(name):
        original = getattr(torch.Tensor, name)

        def wrapper(self, *args, **kwargs):
            seen.append(name)
            return original(self, *args, **kwargs)

        return wrapper

    for name in ("item", "tolist", "numpy", "cpu", "__bool__", "__int__", "__float__"):
        monkeypatch.setattr(torch.Tensor, name, counting(name))
    counts = []
    # 32 rows: 8 batches of 4, or one
    for batch_rows in (4, 1000):
        seen.clear()
        model.calls.clear()
        hellaswag_eval.evaluate(model, few, "cpu", batch_rows=batch_rows)
        counts.append((len(model.calls), list(seen)))
    monkeypatch.undo()
    assert [n for n, _ in counts] == [8, 1]
    assert counts[0][1] == counts[1][1] and len(counts[0][1]) < 8


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_one_sync_and_the_picks_of_the_cpu(model, prepared, alone):
    gpu = copy.deepcopy(model).cuda()
    hellaswag_eval.evaluate(gpu, prepared, "cuda")  # warm-up: CUDA's lazy initialisation
    syncs = []
    for batch_rows in (4, 1000):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                hellaswag_eval.evaluate(gpu, prepared, "cuda", batch_rows=batch_rows)
            finally:
                torch.cuda.set_sync_debug_mode("default")
        syncs.append(sum("synchronizing" in str(w.message) for w in caught))
    # the final counts.tolist() only, however many batches
    assert syncs == [1, 1]
    sums, means = hellaswag_eval.ending_losses(gpu, prepared, "cuda")
    assert torch.equal(sums.argmin(dim=1).cpu(), alone[0].argmin(dim=1))
    assert torch.equal(means.argmin(dim=1).cpu(), alone[1].argmin(dim=1))


# ----------------------------------------------------------------------------------------------
# data files (their bad input: test_bad_input_is_one_line)

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def hub_cache(root, parquet):
    """A hub cache as hf_hub_download leaves it: refs/<revision> names the commit (so
    refs/refs/convert/parquet for the parquet branch), the snapshot links to the blob."""
    repo = root / "datasets--Rowan--hellaswag"
    ref = repo / "refs" / "refs" / "convert" / "parquet"
    ref.parent.mkdir(parents=True)
    ref.write_text(COMMIT)
    data = parquet.read_bytes()
    blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
    blob.parent.mkdir()
    blob.write_bytes(data)
    snapshot = repo / "snapshots" / COMMIT / "default" / "validation" / "0000.parquet"
    snapshot.parent.mkdir(parents=True)
    snapshot.symlink_to(os.path.relpath(blob, snapshot.parent))
    return snapshot


def test_reads_rowanz_jsonl_and_hf_parquet(tmp_path, examples):
    jsonl = tmp_path / "val.jsonl"
    jsonl.write_text(rowanz(examples))
    parquet = write_hf_parquet(tmp_path / "val.parquet", examples)
    assert hellaswag_eval.load_examples(jsonl) == examples
    assert hellaswag_eval.load_examples(str(parquet)) == examples
    assert hellaswag_eval.load_examples(parquet, limit=3) == examples[:3]
    # a string label, as HF keeps it, is fine in a .jsonl too
    jsonl.write_text(json.dumps({**examples[0], "label": "2"}) + "\n")
    assert hellaswag_eval.load_examples(jsonl) == [{**examples[0], "label": 2}]


def test_val_split_comes_from_an_offline_hub_cache(tmp_path, examples, monkeypatch):
    from huggingface_hub import constants

    snapshot = hub_cache(tmp_path / "hub", write_hf_parquet(tmp_path / "hub.parquet", examples))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    assert constants.HF_HUB_OFFLINE  # conftest's environment: no network
    assert hellaswag_eval.download_val() == str(snapshot)
    assert hellaswag_eval.load_examples() == examples


# ----------------------------------------------------------------------------------------------
# DDP: two gloo processes, rank r scoring examples r::2

DDP_WORKER = """
import json, sys
sys.path[:0] = [{root!r}, {tests!r}]
import torch
import hellaswag_eval
from fineweb import get_tokenizer
from test_hellaswag import TinyLM

rank = int(sys.argv[1])
torch.distributed.init_process_group(
    "gloo", init_method="file://{init}", rank=rank, world_size=2
)
model = TinyLM()
model.load_state_dict(torch.load({state!r}))
examples = hellaswag_eval.load_examples({data!r})
prepared = hellaswag_eval.prepare(examples, get_tokenizer(), model.config.block_size)
result = hellaswag_eval.evaluate(model, prepared, "cpu", rank=rank, world_size=2, batch_rows=8)
print(json.dumps([result, len(model.calls)]))
torch.distributed.destroy_process_group()
"""


def test_ddp_two_ranks_give_the_single_process_result(tmp_path, examples, model, prepared):
    (tmp_path / "val.jsonl").write_text(rowanz(examples))
    torch.save(model.state_dict(), tmp_path / "state.pt")
    worker = tmp_path / "ddp_worker.py"
    fields = dict(root=str(ROOT), tests=str(TESTS), init=tmp_path / "init")
    fields.update(state=str(tmp_path / "state.pt"), data=str(tmp_path / "val.jsonl"))
    worker.write_text(DDP_WORKER.format(**fields))
    ranks = [start([sys.executable, worker], [rank]) for rank in range(2)]
    single = hellaswag_eval.evaluate(model, prepared, "cpu", batch_rows=8)
    calls = []
    for proc in ranks:
        code, out, err = finish(proc)
        assert code == 0, err
        result, n_calls = json.loads(out)
        assert result == single
        calls.append(n_calls)
    # each rank scored its own examples: 11 * 4 and 10 * 4 rows, 8 a batch
    assert calls == [6, 5]


# ----------------------------------------------------------------------------------------------
# the command line on a real model (train_gpt2.load_model)


def make_checkpoint(path, tokenizer="gpt2", block_size=64, nan=False):
    """A tiny GPT of train_gpt2's, saved as a training run saves one (its keys: model,
    model_config, step, tokenizer as fineweb.tokenizer_info has it); nan: a NaN among its
    weights, as a run that diverged leaves them."""
    import dataclasses

    config = train_gpt2.GPTConfig(
        block_size=block_size, vocab_size=50304, n_layer=1, n_head=2, n_embd=16
    )
    model = train_gpt2.GPT(config)
    if nan:
        with torch.no_grad():
            model.transformer.h[0].attn.c_proj.weight[2, 3] = float("nan")
    ckpt = {
        "model": model.state_dict(),
        "model_config": dataclasses.asdict(config),
        "step": 10,
        "data": {
            "tokenizer": {"tokenizer": tokenizer, "vocab": None if tokenizer == "gpt2" else "abc"}
        },
    }
    harness.save_checkpoint(path, ckpt)
    return path


def test_cli_on_a_checkpoint_prints_evaluate_s_result(tmp_path, examples, capsys):
    # the command line prints what evaluate() gives
    ckpt = make_checkpoint(tmp_path / "model_00010.pt")
    data = tmp_path / "val.jsonl"
    data.write_text(rowanz(examples))
    gpt, enc = train_gpt2.load_model(str(ckpt), "cpu")
    prepared = hellaswag_eval.prepare(examples[:10], enc, gpt.config.block_size)
    expected = hellaswag_eval.evaluate(gpt, prepared, "cpu")
    argv = ["--model", ckpt, "--data", data, "--limit", 10, "--device", "cpu"]
    hellaswag.main([str(a) for a in argv])
    line = f"acc {expected['acc']:.4f} acc_norm {expected['acc_norm']:.4f} over 10 examples\n"
    assert capsys.readouterr() == (line, "")
    # a real process, `hellaswag.py ... | head -1` with the reader gone first: exit 0, nothing
    # on stderr (no BrokenPipeError's traceback)
    returncode, err = run_with_stdout_closed("hellaswag.py", argv)
    assert returncode == 0 and err == "", err[-2000:]


GOOD = {"ctx": "A man", "endings": ["a", "b", "c", "d"], "label": 1}
# a .jsonl file's second line: what is wrong with it
LINES = {
    "not JSON": ('{"ctx": "A man", "endings": ["a", "b"', "not JSON (Expecting ',' delimiter)"),
    "a list": ("[1, 2]", "need an object with keys ctx, endings, label"),
    "no label": ({"ctx": "A man", "endings": ["a", "b", "c", "d"]}, "need an object with keys"),
    "3 endings": ({**GOOD, "endings": ["a", "b", "c"]}, "need a string ctx and 4 string"),
    "a number ending": ({**GOOD, "endings": ["a", "b", "c", 4]}, "need a string ctx and 4"),
    "no ctx": ({**GOOD, "ctx": None}, "need a string ctx and 4 string endings"),
    "label 7": ({**GOOD, "label": 7}, "label 7 is not 0..3"),
    "label True": ({**GOOD, "label": True}, "label True is not 0..3"),
}


@pytest.fixture(scope="module")
def inputs(tmp_path_factory, examples, quiet_transformers):
    """Every bad input's file, made once: data files (a .jsonl for each of LINES, Latin-1 text,
    a FIFO, parquet files), another program's .pt, checkpoints HellaSwag cannot use, and Hugging
    Face directories without config.json, of a 100-token vocabulary, or with torn weights."""
    from transformers import GPT2Config, GPT2LMHeadModel

    root = tmp_path_factory.mktemp("inputs")
    (root / "val.jsonl").write_text(rowanz(examples))
    for name, (line, _) in LINES.items():
        text = line if isinstance(line, str) else json.dumps(line)
        (root / f"{name}.jsonl").write_text(json.dumps(GOOD) + "\n" + text + "\n")
    (root / "latin1.jsonl").write_bytes(b'{"ctx": "caf\xe9"}\n')
    (root / "blank.jsonl").write_text("\n")
    os.mkfifo(root / "fifo.jsonl")  # would block for ever
    (root / "dir.jsonl").mkdir()
    pq.write_table(pa.table({"ctx": ["x"], "endings": [["a"] * 4]}), root / "nolabel.parquet")
    rows = examples[:3]
    rows[1] = {**rows[1], "label": ""}  # HF's test split: no labels
    write_hf_parquet(root / "unlabelled.parquet", rows)
    (root / "fake.parquet").write_bytes(b"PAR1 not really parquet")
    torch.save({"weights": [1, 2]}, root / "foreign.pt")
    make_checkpoint(root / "model.pt")
    make_checkpoint(root / "char.pt", tokenizer="char")
    make_checkpoint(root / "short.pt", block_size=8)
    make_checkpoint(root / "nan.pt", nan=True)
    os.mkfifo(root / "fifo.pt")  # would block for ever
    (root / "no_config").mkdir()
    (root / "no_config" / "model.safetensors").write_bytes(b"")
    config = GPT2Config(n_positions=64, n_embd=8, n_layer=1, n_head=2, vocab_size=100)
    GPT2LMHeadModel(config).save_pretrained(root / "small_vocab")
    config = GPT2Config(n_positions=64, n_embd=8, n_layer=1, n_head=2)
    GPT2LMHeadModel(config).save_pretrained(root / "torn")
    weights = root / "torn" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    return root


def out_of_memory(monkeypatch):
    # what a GPU says when a batch does not fit (a CPU rarely gets there)
    def forward(self, *args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 9.00 GiB")

    monkeypatch.setattr(train_gpt2.GPT, "forward", forward)


DATA = ["--data", "{inputs}/val.jsonl"]
BAD_INPUTS = {
    "unknown flag": (["--bogus"], "unrecognized arguments: --bogus"),
    "negative limit": (["--limit", -3], "--limit must be 0 (all examples) to 1,000,000"),
    "limit past any split": (
        ["--limit", 10**12],
        "--limit must be 0 (all examples) to 1,000,000: HellaSwag's splits hold about 60,000",
    ),
    "limit not a number": (["--limit", "x"], "argument --limit: invalid int value: 'x'"),
    "no rows a batch": (["--batch_rows", 0], "--batch_rows must be 1 to 16,384"),
    "rows past any GPU": (
        ["--batch_rows", 10**9],
        "--batch_rows must be 1 to 16,384: a batch's logits take rows x width x 50,304 floats",
    ),
    "float16": (["--dtype", "float16"], "argument --dtype: invalid choice: 'float16'"),
    "empty model": (["--model", ""], "--model is empty"),
    "empty data": (["--data", ""], "--data is empty"),
    "unknown device": (["--device", "tpu"], "--device tpu: not cpu, cuda, cuda:N or mps"),
    "absent GPU": (["--device", "cuda:99"], "--device cuda:99: this"),
    "offline, nothing cached": ([], "pass a local copy (.jsonl or .parquet) with hellaswag.py"),
    "missing data": (["--data", "{inputs}/none.jsonl"], "none.jsonl: no such file"),
    "Latin-1": (["--data", "{inputs}/latin1.jsonl"], "latin1.jsonl: not UTF-8 text"),
    "no examples": (["--data", "{inputs}/blank.jsonl"], "blank.jsonl: no examples"),
    "FIFO": (["--data", "{inputs}/fifo.jsonl"], "fifo.jsonl: no such file, or not a regular"),
    "directory": (["--data", "{inputs}/dir.jsonl"], "dir.jsonl: no such file, or not a regular"),
    **{
        f"line: {name}": (["--data", f"{{inputs}}/{name}.jsonl"], f"{name}.jsonl:2: {message}")
        for name, (_, message) in LINES.items()
    },
    "parquet without labels": (
        ["--data", "{inputs}/nolabel.parquet"],
        "nolabel.parquet: no column 'label' (need ctx, endings, label)",
    ),
    "parquet of the test split": (
        ["--data", "{inputs}/unlabelled.parquet"],
        "unlabelled.parquet: row 1: label '' is not 0..3 (the test split has none)",
    ),
    "not parquet": (["--data", "{inputs}/fake.parquet"], "fake.parquet"),
    "another program's .pt": (
        [*DATA, "--model", "{inputs}/foreign.pt"],
        "foreign.pt is not a train_gpt2.py checkpoint",
    ),
    "a character model": (
        [*DATA, "--model", "{inputs}/char.pt"],
        "char.pt uses the char tokenizer; HellaSwag needs GPT-2's",
    ),
    "a short context": (
        [*DATA, "--model", "{inputs}/short.pt"],
        "tokens, more than block_size 8",
    ),
    "no config.json": ([*DATA, "--model", "{inputs}/no_config"], "transformers cannot load it"),
    "another vocabulary": (
        [*DATA, "--model", "{inputs}/small_vocab"],
        "small_vocab: a vocabulary of 100 tokens, not GPT-2's 50,257",
    ),
    "torn weights": ([*DATA, "--model", "{inputs}/torn"], "torn: transformers cannot load it"),
    "no such directory": ([*DATA, "--model", "{inputs}/none"], "none: no such directory"),
    "a FIFO checkpoint": (
        [*DATA, "--model", "{inputs}/fifo.pt"],
        "cannot read checkpoint {inputs}/fifo.pt (not a regular file)",
    ),
    "a diverged checkpoint": (
        [*DATA, "--model", "{inputs}/nan.pt"],
        "nan.pt holds non-finite weights (first: transformer.h.0.attn.c_proj.weight): its run"
        " diverged before it was saved; use an earlier checkpoint",
    ),
    "out of memory": (
        [*DATA, "--model", "{inputs}/model.pt"],
        "out of cpu memory with --batch_rows 64: lower it",
    ),
}


# (loading a Hugging Face GPT-2 directory into our GPT: the GPT-2 contract's); a FIFO opened
# would block for good: the timeout fails the test rather than hang
@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", cases(BAD_INPUTS, contract={"another vocabulary"}))
def test_bad_input_is_one_line(inputs, capsys, monkeypatch, name):
    args, message = BAD_INPUTS[name]
    if name == "out of memory":
        out_of_memory(monkeypatch)
    before = sorted(p.name for p in inputs.iterdir())
    argv = ["--device", "cpu"] + [str(a).format(inputs=inputs) for a in args]
    code, err = run_main(hellaswag.main, argv, capsys)
    one_line_error(code, err, "hellaswag.py", message.format(inputs=inputs))
    assert sorted(p.name for p in inputs.iterdir()) == before  # nothing written
