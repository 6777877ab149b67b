"""hellaswag.py: rendering, the batched scoring (the same picks as each example's 4 rows scored
alone), DDP striding over 2 gloo processes, the results kept on the device, the data readers and
their one-line errors, the hub download from an offline cache, and the command line's one-line
errors and clean stops (real processes). The model is a tiny causal LM defined here."""

import copy
import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path
from types import SimpleNamespace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import hellaswag
from fineweb import get_tokenizer

# under pytest -n N --dist loadgroup: one worker, so the module's fixtures (the processes it
# starts all at once among them) are made once
pytestmark = pytest.mark.xdist_group("hellaswag")
ROOT = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent
CLI = [sys.executable, "hellaswag.py"]
N_EXAMPLES = 21  # odd: the 2 DDP ranks score 11 and 10
WORDS = (
    "the a man woman dog cat ball house runs jumps quickly slowly red blue under over river "
    "mountain cooks paints guitar plays water fire tree green small large bright dark opens closes "
    "window door kitchen knife bread slices carefully then finally begins stops laughs sings"
).split()


class TinyLM(nn.Module):
    """A small causal LM with the interface evaluate() takes: model(idx) -> (logits (N, L, V),
    None), .config.block_size and .config.vocab_size. The vocabulary is padded past GPT-2's
    50257 ids, like our GPT's 50304. It records (training, grad enabled, autocast enabled) at
    every call."""

    def __init__(self, vocab_size=50304, block_size=48, dim=16, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.config = SimpleNamespace(block_size=block_size, vocab_size=vocab_size)
        self.wte = nn.Embedding(vocab_size, dim)
        self.wpe = nn.Embedding(block_size, dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.head = nn.Linear(dim, vocab_size)
        self.calls = []

    def forward(self, idx):
        autocast = torch.is_autocast_enabled(idx.device.type)
        self.calls.append((self.training, torch.is_grad_enabled(), autocast))
        pos = torch.arange(idx.size(1), device=idx.device)
        x = self.wte(idx) + self.wpe(pos)  # (N, L, C)
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        # causal: a row's padding on the right changes nothing before it
        x = x + F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return 2.0 * self.head(x), None


def synthetic_examples(n, seed=0):
    """Random-word examples with contexts and endings of different lengths."""
    rng = random.Random(seed)

    def words(lo, hi):
        return " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))

    examples = []
    for _ in range(n):
        endings = [words(1, 8) + "." for _ in range(4)]
        label = rng.randrange(4)
        examples.append({"ctx": words(3, 12).capitalize(), "endings": endings, "label": label})
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
    tokens, mask, _ = hellaswag.render_example(example, enc)
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
    return hellaswag.prepare(examples, enc, model.config.block_size)


@pytest.fixture(scope="module")
def few(examples, enc, model):
    """The first 8 examples prepared: for the tests that need no more."""
    return hellaswag.prepare(examples[:8], enc, model.config.block_size)


@pytest.fixture(scope="module")
def alone(model, examples, enc):
    """Every example scored by itself: (sums (n, 4), means (n, 4))."""
    scores = [scored_alone(model, ex, enc) for ex in examples]
    return torch.stack([s for s, _ in scores]), torch.stack([m for _, m in scores])


# ----------------------------------------------------------------------------------------------
# rendering


def test_importing_installs_no_signal_handler():
    # only the command line (__main__) catches stop signals
    handlers = [signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)]
    assert hellaswag.stop not in handlers


def test_render_example_rows_mask_and_padding(enc):
    example = {
        "ctx": "A man is sitting on a roof. He",
        "endings": ["is using wrap.", "starts pulling up roofing on a roof.", "x", "sits."],
        "label": 3,
    }
    tokens, mask, label = hellaswag.render_example(example, enc)
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
    tokens, _, _ = hellaswag.render_example(example, enc)
    assert enc.eot_token not in tokens.flatten().tolist()


def test_prepare_lays_out_rows_shortest_first(prepared, examples, enc):
    n = len(examples)
    assert prepared["tokens"].shape == prepared["mask"].shape
    assert prepared["tokens"].size(0) == 4 * n
    assert prepared["labels"].tolist() == [ex["label"] for ex in examples]
    assert prepared["n_vocab"] == enc.n_vocab
    # row 4 * i + j is example i's ending j, as render_example has it
    tokens, mask, _ = hellaswag.render_example(examples[5], enc)
    width = tokens.size(1)
    assert torch.equal(prepared["tokens"][20:24, :width], tokens)
    assert torch.equal(prepared["mask"][20:24, :width], mask)
    assert not prepared["mask"][20:24, width:].any()
    length = prepared["length"][prepared["order"]]
    assert length.tolist() == sorted(length.tolist())

    def cells(rows):
        """Tokens in batches of 8 of these rows, each batch cut to its longest row."""
        batches = [rows[i : i + 8] for i in range(0, len(rows), 8)]
        return sum(len(b) * int(prepared["length"][b].max()) for b in batches)

    # batches of 8 shortest-first rows carry little padding; in file order, much more
    total = int(length.sum())
    assert cells(prepared["order"]) < 1.05 * total
    assert cells(torch.arange(4 * n)) > 1.2 * total


def test_prepare_refuses_what_cannot_be_scored(examples, enc):
    empty = {"ctx": "", "endings": ["a", "b", "c", "d"], "label": 0}
    with pytest.raises(ValueError) as info:
        hellaswag.prepare(examples[:2] + [empty], enc, 48)
    assert str(info.value) == "example 2: the context is empty"
    long = {"ctx": " ".join(["He runs."] * 20), "endings": ["a", "b", "c", "a b"], "label": 0}
    n = len(enc.encode_ordinary(long["ctx"] + " a b"))
    with pytest.raises(ValueError) as info:
        hellaswag.prepare(examples[:2] + [long], enc, 48)
    message = f"example 2: context + ending is {n} tokens, more than block_size 48"
    assert str(info.value) == message
    assert hellaswag.prepare([long], enc, n)["tokens"].size(1) == n


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
        sums, means = hellaswag.ending_losses(model, prepared, "cpu", batch_rows=batch_rows)
        assert torch.equal(sums.argmin(dim=1), picks), batch_rows
        assert torch.equal(means.argmin(dim=1), picks_norm), batch_rows
        torch.testing.assert_close(sums, ref_sum, rtol=0, atol=1e-4)
        torch.testing.assert_close(means, ref_mean, rtol=0, atol=1e-4)
    labels = torch.tensor([ex["label"] for ex in examples])
    result = hellaswag.evaluate(model, prepared, "cpu", batch_rows=7)
    assert result == {
        "n": N_EXAMPLES,
        "acc": (picks == labels).sum().item() / N_EXAMPLES,
        "acc_norm": (picks_norm == labels).sum().item() / N_EXAMPLES,
    }
    assert 0 < result["acc"] < 1 and 0 < result["acc_norm"] < 1


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
    a = hellaswag.ending_losses(padded, few, "cpu")
    b = hellaswag.ending_losses(trimmed, few, "cpu")
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y, rtol=0, atol=1e-4)


def test_rank_scores_every_world_size_th_example(model, prepared, alone):
    sums, means = hellaswag.ending_losses(model, prepared, "cpu", rank=1, world_size=3)
    assert sums.shape == (len(range(1, N_EXAMPLES, 3)), 4)
    torch.testing.assert_close(sums, alone[0][1::3], rtol=0, atol=1e-4)
    torch.testing.assert_close(means, alone[1][1::3], rtol=0, atol=1e-4)


def test_eval_mode_no_grad_autocast_and_the_mode_restored(model, few):
    model.train()
    model.calls.clear()
    hellaswag.evaluate(model, few, "cpu")
    assert model.training
    assert model.calls and set(model.calls) == {(False, False, False)}
    model.calls.clear()
    result = hellaswag.evaluate(model, few, "cpu", autocast_dtype=torch.bfloat16)
    assert set(model.calls) == {(False, False, True)}
    assert result["n"] == 8 and 0 <= result["acc_norm"] <= 1

    class Broken(TinyLM):
        def forward(self, idx):
            raise RuntimeError("out of memory")

    broken = Broken().train()
    with pytest.raises(RuntimeError):
        hellaswag.evaluate(broken, few, "cpu")
    assert broken.training
    model.eval()


def test_results_stay_on_the_device_until_one_sync_at_the_end(model, few, monkeypatch):
    """Every way a tensor's value reaches Python is counted: as many with 8 batches as with one
    (the batch plan's widths and the final counts), none per batch."""
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
        hellaswag.evaluate(model, few, "cpu", batch_rows=batch_rows)
        counts.append((len(model.calls), list(seen)))
    monkeypatch.undo()
    assert counts == [(8, ["tolist", "tolist"]), (1, ["tolist", "tolist"])]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_one_sync_and_the_picks_of_the_cpu(model, prepared, alone):
    gpu = copy.deepcopy(model).cuda()
    hellaswag.evaluate(gpu, prepared, "cuda")  # warm-up: CUDA's lazy initialisation
    syncs = []
    for batch_rows in (4, 1000):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                hellaswag.evaluate(gpu, prepared, "cuda", batch_rows=batch_rows)
            finally:
                torch.cuda.set_sync_debug_mode("default")
        syncs.append(sum("synchronizing" in str(w.message) for w in caught))
    # the final counts.tolist() only, however many batches
    assert syncs == [1, 1]
    sums, means = hellaswag.ending_losses(gpu, prepared, "cuda")
    assert torch.equal(sums.argmin(dim=1).cpu(), alone[0].argmin(dim=1))
    assert torch.equal(means.argmin(dim=1).cpu(), alone[1].argmin(dim=1))


# ----------------------------------------------------------------------------------------------
# data files


def test_reads_rowanz_jsonl_and_hf_parquet(tmp_path, examples):
    jsonl = tmp_path / "val.jsonl"
    jsonl.write_text(rowanz(examples))
    parquet = write_hf_parquet(tmp_path / "val.parquet", examples)
    assert hellaswag.load_examples(jsonl) == examples
    assert hellaswag.load_examples(str(parquet)) == examples
    assert hellaswag.load_examples(parquet, limit=3) == examples[:3]


GOOD = {"ctx": "A man", "endings": ["a", "b", "c", "d"], "label": 1}


@pytest.mark.parametrize(
    "line, message",
    [
        ('{"ctx": "A man", "endings": ["a", "b"', "not JSON (Expecting ',' delimiter)"),
        ("[1, 2]", "need an object with keys ctx, endings, label"),
        ({"ctx": "A man", "endings": ["a", "b", "c", "d"]}, "need an object with keys"),
        ({**GOOD, "endings": ["a", "b", "c"]}, "need a string ctx and 4 string endings"),
        ({**GOOD, "endings": ["a", "b", "c", 4]}, "need a string ctx and 4 string endings"),
        ({**GOOD, "ctx": None}, "need a string ctx and 4 string endings"),
        ({**GOOD, "label": 4}, "label 4 is not 0..3"),
        ({**GOOD, "label": True}, "label True is not 0..3"),
        ({**GOOD, "label": "1"}, None),  # a string label, as HF keeps it, is fine
    ],
)
def test_malformed_jsonl_lines_are_one_line_naming_file_and_line(tmp_path, line, message):
    path = tmp_path / "bad.jsonl"
    text = line if isinstance(line, str) else json.dumps(line)
    path.write_text(json.dumps(GOOD) + "\n" + text + "\n")
    if message is None:
        assert hellaswag.load_examples(path)[1] == GOOD
        return
    with pytest.raises(ValueError) as info:
        hellaswag.load_examples(path)
    assert str(info.value).startswith(f"{path}:2: {message}")
    assert "\n" not in str(info.value)


def test_malformed_parquet_is_one_line_naming_file_and_row(tmp_path, examples):
    path = tmp_path / "bad.parquet"
    rows = examples[:3]
    rows[1] = {**rows[1], "label": ""}  # HF's test split: no labels
    write_hf_parquet(path, rows)
    with pytest.raises(ValueError, match=r"bad.parquet: row 1: label '' is not 0..3 \(the test"):
        hellaswag.load_examples(path)
    pq.write_table(pa.table({"ctx": ["x"], "endings": [["a"] * 4]}), path)
    with pytest.raises(ValueError, match="bad.parquet: no column 'label'"):
        hellaswag.load_examples(path)
    path.write_bytes(b"PAR1 not really parquet")
    with pytest.raises(ValueError, match="bad.parquet"):
        hellaswag.load_examples(path)


def test_unreadable_data_is_one_line(tmp_path):
    (tmp_path / "latin1.jsonl").write_bytes(b'{"ctx": "caf\xe9"}\n')
    (tmp_path / "empty.jsonl").write_text("\n")
    os.mkfifo(tmp_path / "fifo.jsonl")  # would block for ever: refused
    (tmp_path / "dir.jsonl").mkdir()
    cases = {
        "latin1.jsonl": "not UTF-8 text",
        "empty.jsonl": "no examples",
        "fifo.jsonl": "not a regular file",
        "dir.jsonl": "not a regular file",
        "missing.parquet": "no such file",
    }
    for name, message in cases.items():
        with pytest.raises(ValueError) as info:
            hellaswag.load_examples(tmp_path / name)
        assert str(info.value).startswith(f"{tmp_path / name}: ") and message in str(info.value)


# ----------------------------------------------------------------------------------------------
# real processes, started all at once (2 cores: each spends its first seconds importing torch)

DDP_WORKER = """
import json, sys
sys.path[:0] = [{root!r}, {tests!r}]
import torch
import hellaswag
from fineweb import get_tokenizer
from test_hellaswag import TinyLM

rank = int(sys.argv[1])
torch.distributed.init_process_group(
    "gloo", init_method="file://{init}", rank=rank, world_size=2
)
model = TinyLM()
model.load_state_dict(torch.load({state!r}))
examples = hellaswag.load_examples({data!r})
prepared = hellaswag.prepare(examples, get_tokenizer(), model.config.block_size)
result = hellaswag.evaluate(model, prepared, "cpu", rank=rank, world_size=2, batch_rows=8)
print(json.dumps([result, len(model.calls)]))
torch.distributed.destroy_process_group()
"""

HUB_READER = """
import json, hellaswag
print(json.dumps([hellaswag.download_val(), hellaswag.load_examples()]))
"""
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


def child_env(tmp, **extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(HF_HUB_OFFLINE="1", HF_HOME=str(tmp / "hf_home"), OMP_NUM_THREADS="1")
    return {**env, **extra}


def reset_stop_signals(ignore=()):
    """preexec_fn: stop signals at their defaults whatever the runner ignores, but `ignore`."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1):
        signal.signal(sig, signal.SIG_IGN if sig in ignore else signal.SIG_DFL)


def catches(pid, sig):
    """Whether process pid has installed a handler for sig (Linux's /proc/PID/status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    return False


BAD_INPUTS = {
    "unknown flag": (["--bogus"], "unrecognized arguments: --bogus"),
    "negative limit": (["--limit", "-3"], "need --limit >= 0"),
    "unknown device": (["--device", "tpu"], "--device tpu: not usable here"),
    "malformed data": (["--data", "{tmp}/bad.jsonl"], "bad.jsonl:2: label 7 is not 0..3"),
    "offline, nothing cached": (
        [],
        "pass a local copy (.jsonl or .parquet) with hellaswag.py --data FILE",
    ),
}
# name: (the signals sent, one after the other; those the program starts ignoring)
SIGNALS = {
    "SIGINT while torch loads": (["SIGINT"], []),
    "SIGTERM while torch loads": (["SIGTERM"], []),
    "SIGHUP ignored under nohup, then SIGTERM": (["SIGHUP", "SIGTERM"], [signal.SIGHUP]),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory, examples, model):
    """Every process this module starts, started at once: name -> dict(code, out, err, alive),
    alive: whether it still ran 0.3 s after each signal sent; and the hub cache's snapshot."""
    tmp = tmp_path_factory.mktemp("runs")
    (tmp / "val.jsonl").write_text(rowanz(examples))
    (tmp / "bad.jsonl").write_text(rowanz([GOOD, {**GOOD, "label": 7}]))
    # many examples: a stopped run is still busy, however late its signal comes
    (tmp / "big.jsonl").write_text(rowanz(examples) * 500)
    snapshot = hub_cache(tmp / "hub", write_hf_parquet(tmp / "hub.parquet", examples))
    torch.save(model.state_dict(), tmp / "state.pt")
    worker = tmp / "ddp_worker.py"
    fields = dict(root=str(ROOT), tests=str(TESTS), init=tmp / "init", state=str(tmp / "state.pt"))
    worker.write_text(DDP_WORKER.format(data=str(tmp / "val.jsonl"), **fields))

    procs = {}

    def start(name, argv, env=None, ignore=()):
        procs[name] = subprocess.Popen(
            argv,
            cwd=ROOT,
            env=env or child_env(tmp),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=lambda: reset_stop_signals(ignore),
        )

    for name, (_, ignored) in SIGNALS.items():
        start(name, CLI + ["--data", str(tmp / "big.jsonl")], ignore=ignored)
    for name, (args, _) in BAD_INPUTS.items():
        start(name, CLI + [a.format(tmp=tmp) for a in args])
    for rank in range(2):
        start(f"ddp rank {rank}", [sys.executable, str(worker), str(rank)])
    start(
        "hub cache",
        [sys.executable, "-c", HUB_READER],
        child_env(tmp, HF_HUB_CACHE=str(tmp / "hub")),
    )

    alive = {name: [] for name in procs}
    for name, (signals, _) in SIGNALS.items():
        proc = procs[name]
        deadline = time.monotonic() + 60
        # hellaswag.py's handlers go in before torch's import: the last one is SIGUSR1's
        while not catches(proc.pid, signal.SIGUSR1) and time.monotonic() < deadline:
            time.sleep(0.01)
        for sig in signals:
            proc.send_signal(getattr(signal, sig))
            time.sleep(0.3)
            alive[name].append(proc.poll() is None)
    done = {}
    for name, proc in procs.items():
        out, err = proc.communicate(timeout=120)
        done[name] = dict(code=proc.returncode, out=out, err=err, alive=alive[name])
    return dict(procs=done, snapshot=snapshot)


@pytest.mark.parametrize("name", sorted(BAD_INPUTS))
def test_cli_bad_input_is_one_line(runs, name):
    run = runs["procs"][name]
    assert run["code"] != 0 and run["out"] == "", run
    assert run["err"].count("\n") == 1, run["err"]
    assert run["err"].startswith("hellaswag.py: error: "), run["err"]
    assert BAD_INPUTS[name][1] in run["err"], run["err"]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--dtype", "float16"], "argument --dtype: invalid choice: 'float16'"),
        (["--limit", "x"], "argument --limit: invalid int value: 'x'"),
        (["--batch_rows", "0"], "--batch_rows >= 1"),
        (["--device", "cuda:99"], "--device cuda:99: not usable here"),
        (["--device", "cuda:x"], "--device cuda:x: not usable here"),
        (["--data", "{tmp}/missing.jsonl"], "missing.jsonl: no such file"),
        (["--data", "{tmp}/nolabel.parquet"], "nolabel.parquet: no column 'label'"),
    ],
)
def test_more_bad_input_in_process(tmp_path, capsys, argv, message):
    """main() as the processes above run it: more of the same one-line errors, cheaper."""
    pq.write_table(pa.table({"ctx": ["x"], "endings": [["a"] * 4]}), tmp_path / "nolabel.parquet")
    with pytest.raises(SystemExit) as info:
        hellaswag.main([a.format(tmp=tmp_path) for a in argv])
    # argparse prints its line; ours is sys.exit's message
    err = capsys.readouterr().err or f"{info.value.code}\n"
    assert err.count("\n") == 1 and err.startswith("hellaswag.py: error: "), err
    assert message in err, err


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc/PID/status")
@pytest.mark.parametrize("name", sorted(SIGNALS))
def test_cli_stop_signal_is_one_line(runs, name):
    run = runs["procs"][name]
    last = SIGNALS[name][0][-1]
    assert (run["code"], run["out"]) == (1, ""), run
    assert run["err"] == f"hellaswag.py: stopped by {last}\n"


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc/PID/status")
def test_cli_ignored_sighup_stays_ignored(runs):
    run = runs["procs"]["SIGHUP ignored under nohup, then SIGTERM"]
    assert run["alive"][0], "SIGHUP stopped it"
    assert run["err"] == "hellaswag.py: stopped by SIGTERM\n"


def test_ddp_two_ranks_give_the_single_process_result(runs, model, prepared):
    single = hellaswag.evaluate(model, prepared, "cpu", batch_rows=8)
    calls = []
    for rank in range(2):
        run = runs["procs"][f"ddp rank {rank}"]
        assert run["code"] == 0, run["err"]
        result, n_calls = json.loads(run["out"])
        assert result == single
        calls.append(n_calls)
    # each rank scored its own examples: 11 * 4 and 10 * 4 rows, 8 a batch
    assert calls == [6, 5]


def test_val_split_comes_from_an_offline_hub_cache(runs, examples):
    run = runs["procs"]["hub cache"]
    assert run["code"] == 0, run["err"]
    path, loaded = json.loads(run["out"])
    assert path == str(runs["snapshot"])
    assert loaded == examples


# ----------------------------------------------------------------------------------------------
# the command line on a real model (train_gpt2.load_model; the lead enables these)


def make_checkpoint(path, tokenizer="gpt2"):
    """A tiny GPT of train_gpt2's, saved as a training run saves one (its keys: model,
    model_config, step, tokenizer as fineweb.tokenizer_info has it)."""
    import dataclasses

    import train_gpt2

    config = train_gpt2.GPTConfig(block_size=64, vocab_size=50304, n_layer=1, n_head=2, n_embd=16)
    ckpt = {
        "model": train_gpt2.GPT(config).state_dict(),
        "model_config": dataclasses.asdict(config),
        "step": 10,
        "tokenizer": {"tokenizer": tokenizer, "vocab": None if tokenizer == "gpt2" else "abc"},
    }
    torch.save(ckpt, path)
    return path


def test_cli_on_a_checkpoint_prints_evaluate_s_result(tmp_path, examples):
    import train_gpt2

    ckpt = make_checkpoint(tmp_path / "model_00010.pt")
    data = tmp_path / "val.jsonl"
    data.write_text(rowanz(examples))
    gpt, enc = train_gpt2.load_model(str(ckpt), "cpu")
    prepared = hellaswag.prepare(examples[:10], enc, gpt.config.block_size)
    expected = hellaswag.evaluate(gpt, prepared, "cpu")
    argv = ["--model", str(ckpt), "--data", str(data), "--limit", "10", "--device", "cpu"]
    proc = subprocess.run(
        CLI + argv, cwd=ROOT, env=child_env(tmp_path), capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    line = f"acc {expected['acc']:.4f} acc_norm {expected['acc_norm']:.4f} over 10 examples\n"
    assert proc.stdout == line


def test_cli_refuses_a_model_of_another_tokenizer(tmp_path, examples):
    ckpt = make_checkpoint(tmp_path / "char.pt", tokenizer="char")
    data = tmp_path / "val.jsonl"
    data.write_text(rowanz(examples))
    argv = ["--model", str(ckpt), "--data", str(data), "--device", "cpu"]
    proc = subprocess.run(
        CLI + argv, cwd=ROOT, env=child_env(tmp_path), capture_output=True, text=True
    )
    assert proc.returncode == 1 and proc.stdout == ""
    assert (
        proc.stderr
        == f"hellaswag.py: error: {ckpt} uses the char tokenizer; HellaSwag needs GPT-2's\n"
    )
