"""HellaSwag evaluation: rendering, the shifted scoring, packed == straightforward, batching, DDP sharding, loading
for training, the CLI and its errors. The model is any GPT built from GPTConfig (with GPT-2's vocabulary, which
HellaSwag's text needs); parity with Hugging Face's logits is in test_gpt2_contract.py."""

import dataclasses
import json
import os
import random
import re
import sys
import urllib.error
from pathlib import Path

import pytest
import torch

import hellaswag
import launcher
from fineweb import get_tokenizer
from train_gpt2 import GPT, GPTConfig
from helpers import child_env

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py: tiny models lose to a second thread's synchronisation

ROOT = Path(__file__).resolve().parents[1]
WORDS = (
    "the a man woman dog cat ball house runs jumps quickly slowly red blue under over river mountain cooks "
    "paints guitar plays water fire tree green small large bright dark opens closes window door kitchen "
    "knife bread slices carefully then finally begins stops laughs sings dances car drives road city night"
).split()


def synthetic_examples(n: int, seed: int = 0) -> list[dict]:
    """Random-word examples: short contexts and endings of different lengths, so the model's choices vary."""
    rng = random.Random(seed)
    words = lambda lo, hi: " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))  # noqa: E731
    examples = []
    for i in range(n):
        ex = {"ind": i, "ctx": words(3, 12).capitalize(), "endings": [words(1, 8) + "." for _ in range(4)]}
        ex["label"] = rng.randrange(4)
        examples.append(ex)
    return examples


def write_jsonl(path: Path, rows) -> Path:
    path.write_text("".join((row if isinstance(row, str) else json.dumps(row)) + "\n" for row in rows))
    return path


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    """A tiny random GPT with GPT-2's vocabulary, the same weights as a checkpoint file, and synthetic examples."""
    tmp = tmp_path_factory.mktemp("hellaswag")
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=64, vocab_size=50257, n_layer=2, n_head=2, n_embd=32)).eval()
    with torch.no_grad():  # wide matrices spread the logits, so the choices vary and nothing is a near-tie
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.2)
    ckpt = tmp / "ckpt.pt"
    torch.save({"model": model.state_dict(), "model_config": dataclasses.asdict(model.config)}, ckpt)
    examples = synthetic_examples(50)
    data = write_jsonl(tmp / "synthetic.jsonl", examples)
    return dict(tmp=tmp, ckpt=ckpt, model=model, examples=examples, data=data)


@pytest.fixture(scope="module")
def single(assets):
    """The single-process, default-batch result on the synthetic examples, which other paths must reproduce."""
    return hellaswag.evaluate(assets["model"], assets["examples"], "cpu", enc=get_tokenizer())


# ----------------------------------------------------------------------------------------------------------
# Rendering


def test_render_example_tokens_mask_and_padding():
    enc = get_tokenizer()
    example = {"ctx": "A man is sitting on a roof. He", "endings": ["is using wrap to wrap a pair of skis.",
               "starts pulling up roofing.", "is ripping level tiles off.", "holds a rubik's cube."], "label": 3}
    tokens, mask, label = hellaswag.render_example(example, get_tokenizer())
    ctx = enc.encode_ordinary(example["ctx"])
    ends = [enc.encode_ordinary(" " + e) for e in example["endings"]]
    length = len(ctx) + max(len(e) for e in ends)
    assert label == 3
    assert tokens.shape == mask.shape == (4, length) and tokens.dtype == torch.long
    for i, end in enumerate(ends):
        n = len(ctx) + len(end)
        assert tokens[i].tolist() == ctx + end + [0] * (length - n)
        assert mask[i].tolist() == [0] * len(ctx) + [1] * len(end) + [0] * (length - n)
    assert len({len(e) for e in ends}) > 1  # the padding was exercised


def test_render_example_uses_given_encoder_and_plain_text_special_tokens():
    example = {"ctx": "Say <|endoftext|>", "endings": ["a", "b", "c", "d"], "label": 0}
    tokens, mask, _ = hellaswag.render_example(example, get_tokenizer())
    assert 50256 not in tokens.tolist()[0]  # the special token's text is ordinary text here


# ----------------------------------------------------------------------------------------------------------
# Scoring


def test_ending_losses_uses_the_shift():
    # Context token 7, then one ending token r + 1 for row r. Position 0 (which predicts the ending) strongly
    # favours token 3, i.e. row 2; position 1 (what an unshifted scorer would read) favours token 1, i.e. row 0.
    V = 10
    tokens = torch.tensor([[7, r + 1] for r in range(4)])
    mask = torch.tensor([[0, 1]] * 4)
    logits = torch.zeros(4, 2, V)
    logits[:, 0, 3] = 5.0
    logits[:, 1, 1] = 5.0
    sum_loss, mean_loss = hellaswag.ending_losses(logits, tokens, mask)
    logp = logits[0, 0].log_softmax(-1)
    assert torch.allclose(sum_loss, -logp[tokens[:, 1]])
    assert sum_loss.argmin().item() == 2
    assert torch.equal(sum_loss, mean_loss)  # one token per ending


def test_ending_losses_sum_vs_mean_and_padding():
    # Row 0: one ending token with loss a; row 1: two tokens with losses b, c. Rows 2-3 pad row 0 with junk.
    V = 6
    torch.manual_seed(0)
    logits = torch.randn(2, 4, V)
    tokens = torch.tensor([[1, 2, 0, 0], [1, 3, 4, 0]])
    mask = torch.tensor([[0, 1, 0, 0], [0, 1, 1, 0]])
    sum_loss, mean_loss = hellaswag.ending_losses(logits, tokens, mask)
    logp = logits.log_softmax(-1)
    a = -logp[0, 0, 2]
    b, c = -logp[1, 0, 3], -logp[1, 1, 4]
    assert torch.allclose(sum_loss, torch.stack([a, b + c]))
    assert torch.allclose(mean_loss, torch.stack([a, (b + c) / 2]))
    # Nothing after the ending matters: not the logits there, not the padding tokens.
    logits2, tokens2 = logits.clone(), tokens.clone()
    logits2[0, 1:] = 100 * torch.randn(3, V)
    tokens2[0, 2:] = torch.tensor([5, 5])
    assert torch.equal(hellaswag.ending_losses(logits2, tokens2, mask)[0], sum_loss)


def test_ending_losses_rejects_an_unpredictable_first_token():
    with pytest.raises(ValueError, match="position 0"):
        hellaswag.ending_losses(torch.zeros(1, 2, 5), torch.zeros(1, 2, dtype=torch.long), torch.tensor([[1, 1]]))


# ----------------------------------------------------------------------------------------------------------
# Model-level: parity with Hugging Face, batching, DDP


def test_batched_equals_one_at_a_time(assets):
    model, examples = assets["model"], assets["examples"]
    one = hellaswag.score_examples(model, examples, "cpu", enc=get_tokenizer(), batch_size=1)
    batched = hellaswag.score_examples(model, examples, "cpu", enc=get_tokenizer(), batch_size=7)  # an uneven last batch too
    for a, b in zip(one, batched):
        assert torch.allclose(a.float(), b.float(), rtol=0, atol=1e-4)  # only matmul rounding differs
    sum_loss, mean_loss, labels = one
    assert torch.equal(sum_loss.argmin(1), batched[0].argmin(1))
    assert torch.equal(mean_loss.argmin(1), batched[1].argmin(1))
    result = hellaswag.evaluate(model, examples, "cpu", enc=get_tokenizer(), batch_size=16)
    assert result["correct"] == (sum_loss.argmin(1) == labels).sum().item()
    assert result["correct_norm"] == (mean_loss.argmin(1) == labels).sum().item()


def test_evaluate_restores_training_mode(assets):
    model = assets["model"].train()
    hellaswag.evaluate(model, assets["examples"][:3], "cpu", enc=get_tokenizer())
    assert model.training
    model.eval()


def _ddp_worker(rank, world_size, init_file, ckpt, data, out_dir):
    import hellaswag as hs  # a fresh process: the module under test, from the repo on sys.path
    from train_gpt2 import load_model as load

    torch.distributed.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    try:
        torch.set_num_threads(1)
        (model, enc), examples = load(ckpt, "cpu"), hs.load_examples(data=data)
        result = hs.evaluate(model, examples, "cpu", enc=enc, batch_size=4, rank=rank, world_size=world_size)
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result))
    finally:
        torch.distributed.destroy_process_group()


def test_ddp_two_ranks_equal_single_process(assets, single):
    tmp = assets["tmp"] / "ddp"
    tmp.mkdir()
    args = (2, str(tmp / "init"), str(assets["ckpt"]), str(assets["data"]), str(tmp))
    torch.multiprocessing.spawn(_ddp_worker, args=args, nprocs=2, join=True)
    for rank in range(2):
        assert json.loads((tmp / f"rank{rank}.json").read_text()) == single


def _load_worker(rank, world_size, init_file, data, out_dir):
    import hellaswag as hs

    hs.DEFAULT_CACHE_DIR = Path(out_dir) / "no_cache"  # offline (conftest) and nothing cached: the split is unavailable
    torch.distributed.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    try:
        good = hs.load_for_training(data, 2, "gpt2", rank, world_size, "cpu")
        offline = hs.load_for_training("", 2, "gpt2", rank, world_size, "cpu")  # the official split, not cached
        try:
            hs.load_for_training(data if rank == 0 else data + ".missing", 2, "gpt2", rank, world_size, "cpu")
            bad = "no error"
        except ValueError as e:
            bad = str(e)
        result = [[len(good[0]), good[1]], [len(offline[0]), offline[1][:40]], bad]
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result))
    finally:
        torch.distributed.destroy_process_group()


def test_loading_for_training_succeeds_or_fails_on_every_rank_alike(assets):
    """All ranks take part in the evaluation or none does: the official split unavailable (offline) skips it on
    every rank; a --hellaswag_data file one rank cannot read stops every rank (none waits in a collective alone)."""
    tmp = assets["tmp"] / "ddp_load"
    tmp.mkdir()
    torch.multiprocessing.spawn(_load_worker, args=(2, str(tmp / "init"), str(assets["data"]), str(tmp)), nprocs=2,
                                join=True)
    (good0, off0, bad0), (good1, off1, bad1) = (json.loads((tmp / f"rank{r}.json").read_text()) for r in range(2))
    assert good0 == good1 == [2, ""]
    assert off0[0] == off1[0] == 0 and off0[1] and off1[1]
    assert "does not exist" in bad1 and bad0 == f"{assets['data']}: unreadable on another rank"


def test_loading_for_training_skips_another_tokenizer(assets):
    assert hellaswag.load_for_training(str(assets["data"]), 0, "char", 0, 1, "cpu") == \
        ([], "the model's tokenizer is char, not GPT-2's")
    assert len(hellaswag.load_for_training(str(assets["data"]), 0, "gpt2", 0, 1, "cpu")[0]) == 50


def test_context_longer_than_block_size_is_an_error(assets):
    long = {"ctx": " ".join(["word"] * 100), "endings": ["a", "b", "c", "d"], "label": 0}
    with pytest.raises(ValueError, match="block_size 64"):
        hellaswag.evaluate(assets["model"], assets["examples"][:2] + [long], "cpu", enc=get_tokenizer())


# ----------------------------------------------------------------------------------------------------------
# Data files and download


def test_load_examples_reads_a_local_file(assets):
    assert hellaswag.load_examples(data=assets["data"]) == assets["examples"]


@pytest.mark.parametrize(
    "line, problem",
    [
        ('{"ctx": "x", "endings": ["a", "b"', ":2: Expecting"),  # truncated JSON
        ({"ctx": "x", "endings": ["a", "b", "c", "d"], "label": 4}, ":2: 'label' must be an integer in 0..3"),
        ({"ctx": "x", "endings": ["a", "b", "c", "d"], "label": True}, ":2: 'label'"),
        ({"ctx": "x", "endings": ["a", "b", "c", "d"]}, ":2: 'label' is missing"),
        (
            {"ctx": "x", "endings": ["a", "b", "c"], "label": 0},
            ":2: 'endings' must be a list of exactly 4 endings, got 3",
        ),
        ({"ctx": "", "endings": ["a", "b", "c", "d"], "label": 0}, ":2: 'ctx'"),
        ([1, 2], ":2: an example must be a JSON object"),
    ],
)
def test_malformed_lines_name_the_line_and_problem(tmp_path, line, problem):
    good = {"ctx": "x", "endings": ["a", "b", "c", "d"], "label": 1}
    path = write_jsonl(tmp_path / "bad.jsonl", [good, line])
    with pytest.raises(ValueError) as info:
        hellaswag.load_examples(data=path)
    assert problem in str(info.value)


def test_render_example_validates():
    with pytest.raises(ValueError, match="exactly 4"):
        hellaswag.render_example({"ctx": "x", "endings": ["a"] * 5, "label": 0}, get_tokenizer())


def test_offline_without_cache_asks_for_data(tmp_path):
    assert os.environ["HF_DATASETS_OFFLINE"] == "1"  # conftest
    with pytest.raises(FileNotFoundError, match="--data"):
        hellaswag.load_examples("val", cache_dir=tmp_path)


def test_failed_download_asks_for_data_and_leaves_nothing(tmp_path, monkeypatch):
    def unreachable(url, timeout):
        raise urllib.error.URLError("no route to host")

    monkeypatch.delenv("HF_DATASETS_OFFLINE")
    monkeypatch.setattr(hellaswag.urllib.request, "urlopen", unreachable)
    with pytest.raises(FileNotFoundError, match="--data") as info:
        hellaswag.load_examples("val", cache_dir=tmp_path)
    assert "no route to host" in str(info.value)
    assert list(tmp_path.iterdir()) == []


class FakeResponse:
    """What urlopen returns, serving body in two chunks under a given Content-Length."""

    def __init__(self, body: bytes, length: int):
        self.headers = {"Content-Length": str(length)}
        self.chunks = [body[:100], body[100:], b""]

    def read(self, n):
        return self.chunks.pop(0)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_download_writes_the_cache_once(tmp_path, monkeypatch, assets):
    body, calls = assets["data"].read_bytes(), []

    def fake_urlopen(url, timeout):
        calls.append(url)
        return FakeResponse(body, len(body))

    monkeypatch.delenv("HF_DATASETS_OFFLINE")
    monkeypatch.setattr(hellaswag.urllib.request, "urlopen", fake_urlopen)
    for _ in range(2):
        assert hellaswag.load_examples("val", cache_dir=tmp_path) == assets["examples"]
    assert calls == [hellaswag.DATA_URL.format(split="val")]
    assert [p.name for p in tmp_path.iterdir()] == ["hellaswag_val.jsonl"]


def test_truncated_download_is_not_cached(tmp_path, monkeypatch, assets):
    body = assets["data"].read_bytes()
    monkeypatch.delenv("HF_DATASETS_OFFLINE")
    monkeypatch.setattr(hellaswag.urllib.request, "urlopen", lambda url, timeout: FakeResponse(body, len(body) + 10))
    with pytest.raises(FileNotFoundError, match="incomplete"):
        hellaswag.load_examples("val", cache_dir=tmp_path)
    assert list(tmp_path.iterdir()) == []


# ----------------------------------------------------------------------------------------------------------
# CLI


def run_cli(*args):
    return launcher.run([sys.executable, str(ROOT / "hellaswag.py"), *args], cwd=ROOT, env=child_env(), timeout=300)


def final_line(stdout: str) -> tuple[int, float, float]:
    match = re.fullmatch(r"(\d+) acc: (\d\.\d{4}) acc_norm: (\d\.\d{4})", stdout.strip().splitlines()[-1])
    assert match, stdout
    return int(match[1]), float(match[2]), float(match[3])


def test_cli_on_a_checkpoint_equals_evaluate(assets, single):
    proc = run_cli("--model", assets["ckpt"], "--data", assets["data"], "--device", "cpu", "--batch_size", 5)
    assert proc.returncode == 0, proc.stderr
    assert final_line(proc.stdout) == (50, round(single["acc"], 4), round(single["acc_norm"], 4))


def test_cli_no_data_offline_is_one_line_without_traceback(tmp_path):
    proc = run_cli("--model", tmp_path / "unused.pt", "--cache_dir", tmp_path)  # data is loaded first
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "--data" in lines[0], proc.stderr


def test_main_limit(assets, capsys):
    argv = ["--model", str(assets["ckpt"]), "--data", str(assets["data"]), "--device", "cpu", "--limit", "10"]
    assert hellaswag.main(argv) == 0
    assert final_line(capsys.readouterr().out)[0] == 10


@pytest.mark.parametrize("case, expected", [("malformed", "bad.jsonl:2:"), ("missing_model", "does not exist")])
def test_main_user_errors_are_one_line(assets, tmp_path, capsys, case, expected):
    data, model = assets["data"], assets["ckpt"]
    if case == "malformed":
        data = write_jsonl(tmp_path / "bad.jsonl", [assets["examples"][0], "{oops"])
    else:
        model = tmp_path / "missing.pt"
    assert hellaswag.main(["--model", str(model), "--data", str(data), "--device", "cpu"]) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0], lines


# ----------------------------------------------------------------------------------------------------------
# The fast path (packed rows: each context once; lm_head only where scored) equals the straightforward one


def straightforward_losses(model, examples) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum, mean) losses (n, 4), written out independently: per example its (4, L) rows whole through the
    model, logits at every position, log-softmax, the ending tokens picked out one by one."""
    sums, means = [], []
    with torch.no_grad():
        for ex in examples:
            tokens, mask, _ = hellaswag.render_example(ex, get_tokenizer())
            logp = model(tokens)[0].log_softmax(-1)  # (4, L, V)
            s = [-sum(logp[r, t - 1, tokens[r, t]] for t in range(tokens.size(1)) if mask[r, t]) for r in range(4)]
            sums.append(torch.stack(s))
            means.append(sums[-1] / mask.sum(1))
    return torch.stack(sums), torch.stack(means)


def test_packed_scoring_equals_the_straightforward_way(assets):
    model = assets["model"]
    edge = [{"ctx": "Hi", "endings": ["a", "b", "c", "d"], "label": 1},  # one context token, one token per ending
            {"ctx": "Hi", "endings": ["there", "you", "all", "a b c"], "label": 0}]
    examples = assets["examples"][:30] + edge
    ref_sum, ref_mean = straightforward_losses(model, examples)
    assert len(set(ref_sum.argmin(1).tolist())) > 1 and not torch.equal(ref_sum.argmin(1), ref_mean.argmin(1))

    runs = [dict(batch_size=1), dict(batch_size=4), dict(batch_size=64), dict(batch_size=1, packed=False)]
    for kwargs in runs:
        sum_loss, mean_loss, labels = hellaswag.score_examples(model, examples, "cpu", enc=get_tokenizer(), **kwargs)
        assert torch.equal(sum_loss.argmin(1), ref_sum.argmin(1)), kwargs
        assert torch.equal(mean_loss.argmin(1), ref_mean.argmin(1)), kwargs
        torch.testing.assert_close(sum_loss, ref_sum, rtol=1e-5, atol=1e-4, msg=str(kwargs))  # fp32 rounding only
        torch.testing.assert_close(mean_loss, ref_mean, rtol=1e-5, atol=1e-4, msg=str(kwargs))
        assert labels.tolist() == [ex["label"] for ex in examples]


def test_pack_layout_on_a_hand_built_example():
    """Context [5, 6], endings [7], [8, 9], [10, 11, 12], [13]: one row, each ending but its last token after
    the context, positions restarting at 2, each ending seeing the context and itself only."""
    tokens = torch.tensor([[5, 6, 7, 0, 0], [5, 6, 8, 9, 0], [5, 6, 10, 11, 12], [5, 6, 13, 0, 0]])
    mask = torch.tensor([[0, 0, 1, 0, 0], [0, 0, 1, 1, 0], [0, 0, 1, 1, 1], [0, 0, 1, 0, 0]])
    short = (torch.tensor([[5, 6, 7]] * 4), torch.tensor([[0, 0, 1]] * 4), 0)  # 1-token endings: packs to [5, 6]
    p = hellaswag.pack([(tokens, mask, 0), short])
    assert p["tokens"].tolist() == [[5, 6, 8, 10, 11], [5, 6, 0, 0, 0]]
    assert p["pos"].tolist() == [[0, 1, 2, 2, 3], [0, 1, 0, 0, 0]]
    sees = [[1, 0, 0, 0, 0],  # context: causal
            [1, 1, 0, 0, 0],
            [1, 1, 1, 0, 0],  # ending 1's first token: the context and itself
            [1, 1, 0, 1, 0],  # ending 2's first token: not ending 1
            [1, 1, 0, 1, 1]]
    assert p["attn_mask"][0, 0].int().tolist() == sees
    assert p["attn_mask"][1, 0].int().tolist() == [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0],
                                                   [1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]  # padding: never NaN rows
    assert p["row"].tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    # window r: the last context token, then ending r; its hidden states come from these packed positions
    assert p["window_tokens"][:4].tolist() == [[6, 7, 0, 0], [6, 8, 9, 0], [6, 10, 11, 12], [6, 13, 0, 0]]
    assert p["window_mask"][:4].tolist() == [[0, 1, 0, 0], [0, 1, 1, 0], [0, 1, 1, 1], [0, 1, 0, 0]]
    assert p["where"][:4, :3].tolist() == [[1, 0, 0], [1, 2, 0], [1, 3, 4], [1, 0, 0]]
    assert p["window_tokens"][4:].tolist() == [[6, 7, 0, 0]] * 4 and p["where"][4:, 0].tolist() == [1] * 4


def test_ending_losses_from_hidden_states_and_head():
    """Given lm_head, ending_losses projects only the scored positions; the losses are those of full logits."""
    torch.manual_seed(0)
    head = torch.nn.Linear(8, 11, bias=False).double()
    hidden = torch.randn(3, 5, 8, dtype=torch.float64)
    tokens = torch.randint(0, 11, (3, 5))
    mask = torch.tensor([[0, 1, 1, 0, 0], [0, 0, 1, 1, 1], [0, 1, 0, 0, 0]])
    seen = []
    head.register_forward_hook(lambda module, args, out: seen.append(args[0].shape))
    got = hellaswag.ending_losses(hidden, tokens, mask, head=head)
    assert seen == [(6, 8)]  # the 6 scored positions only, not all 15
    for a, b in zip(got, hellaswag.ending_losses(head(hidden), tokens, mask)):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
