"""bench.py: the quick run end to end (as a user runs it), its argument checks, and its table and loader
helpers. No timing is asserted: the machine is shared, only the shape of the output is."""

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch

import bench
import launcher
import fineweb
import train_gpt2
from helpers import child_env

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_quick_run_prints_tables_and_writes_json(tmp_path):
    out = tmp_path / "out" / "bench.json"  # a directory that does not exist yet
    proc = launcher.run([sys.executable, "bench.py", "--quick", "--json", str(out)], cwd=ROOT, env=child_env(), timeout=540)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    text = proc.stdout
    assert not proc.stderr.strip()  # progress goes to stdout too: stderr is for errors
    header = next(line for line in text.splitlines() if not line.startswith("[bench] "))
    assert header.startswith("bench.py --preset quick | cpu") and "| torch " in header and " UTC" in header
    for title in ("train step", "generation", "HellaSwag scoring", "DataLoaderLite", "fineweb.py tokenizing"):
        assert title in text, title
    for column in ("ms/step", "tok/s", "MFU", "new tokens", "speed-up", "examples/s", "same predictions",
                   "traced peak MB", "anon RSS +MB", "wall s", "vs baseline"):
        assert column in text, column
    assert "outputs token-identical: yes" in text
    assert "FAILED" not in text

    assert not list(out.parent.glob(".*tmp*"))  # the atomic write left no temp file behind
    results = json.loads(out.read_text())
    assert results["preset"] == "quick" and results["failures"] == []
    sections = results["sections"]
    assert set(sections) == set(bench.DEFAULT_SECTIONS)  # not compare: it runs whole programs for minutes
    assert all("error" not in s for s in sections.values())
    train = sections["train"]["rows"]
    assert [r["batch_size"] for r in train] == [2, 4]
    assert all(r["tokens_per_s"] > 0 and r["mfu"] is None for r in train)  # no MFU on a CPU
    gen = sections["generate"]
    assert gen["identical"] and gen["fits_block"] and [r["path"] for r in gen["rows"]] == ["no cache", "KV cache"]
    hella = sections["hellaswag"]
    assert [r["batch_size"] for r in hella["rows"]] == [1, 4] and hella["same_predictions"] is True
    assert [r["shard_tokens"] for r in sections["loader"]["rows"]] == [200_000, 2_000_000]
    fw = sections["fineweb"]["rows"]
    assert fw[0]["method"].startswith("baseline") and fw[0]["vs_baseline"] == 1.0
    assert len({r["tokens"] for r in fw}) == 1  # every method tokenized the same corpus


def test_loader_memory_does_not_grow_with_the_shard(tmp_path):
    """The loader's allocations are a batch's worth whatever the shard size: shards are memory-mapped."""
    results = bench.main(["--only", "loader", "--loader_tokens", "100000,2000000", "--loader_batch", "8",
                          "--loader_seq", "256", "--json", str(tmp_path / "b.json")])
    small, large = results["sections"]["loader"]["rows"]
    batch_bytes = 8 * 256 * (8 + 2)  # the int64 window and its uint16 source
    for row in (small, large):
        assert row["batches"] == (row["shard_tokens"] - 1) // (8 * 256)
        index_bytes = 4 * 16 * row["batches"]  # the (shard, start) index, 16 bytes a window, and its temporaries
        assert row["traced_peak_mb"] * 1e6 < 4 * batch_bytes + index_bytes + 64_000, row
    assert large["traced_vs_shard"] < 0.02  # about 2% of a 4 MB shard read in windows of only 2,049 tokens


def test_hellaswag_measurement(tmp_path):
    """The reference way first, then hellaswag.py's, which must reproduce the reference's scores."""
    results = bench.main(["--quick", "--only", "hellaswag", "--hellaswag_examples", "4", "--hellaswag_batch", "2,4",
                          "--json", str(tmp_path / "b.json")])
    r = results["sections"]["hellaswag"]
    assert r["same_predictions"] is True
    assert [row["batch_size"] for row in r["rows"]] == [1, 2, 4] and r["rows"][0]["speedup"] == 1.0
    assert "reference" in r["rows"][0]["method"] and all(row["max_loss_diff"] < 1e-3 for row in r["rows"])
    # FLOPs counted from the tokens through the blocks and lm_head: the reference runs 4 full rows per example
    import hellaswag

    args = bench.parse_args(["--quick"])
    config = bench.model_config(args, "train")
    rows = sum(4 * hellaswag.render_example(ex, fineweb.get_tokenizer())[0].size(1)
               for ex in bench.synthetic_hellaswag(4, seed=1337))
    per_token = 2 * (config.n_layer * 12 * config.n_embd ** 2 + config.vocab_size * config.n_embd)
    assert r["rows"][0]["gflop_per_example"] == pytest.approx(rows * per_token / 4 / 1e9)
    assert r["rows"][0]["flop_ratio"] == 1.0 and all(row["flop_ratio"] > 1.5 for row in r["rows"][1:])


@pytest.mark.parametrize("context, ending", [(bench.HELLASWAG_CONTEXT, bench.HELLASWAG_ENDING), ((2, 12), (1, 5))])
def test_synthetic_hellaswag_examples_have_the_stated_lengths(context, ending):
    import hellaswag

    examples = bench.synthetic_hellaswag(12, 0, context, ending)
    assert examples == bench.synthetic_hellaswag(12, 0, context, ending)  # seeded
    enc = fineweb.get_tokenizer()
    context_lengths = []
    for example in examples:
        hellaswag.check_example(example)
        context_lengths.append(len(enc.encode_ordinary(example["ctx"])))
        for text in example["endings"]:
            assert ending[0] <= len(enc.encode_ordinary(" " + text)) <= ending[1]
    assert all(context[0] <= n <= context[1] for n in context_lengths)
    assert len(set(context_lengths)) > 6  # spread over the range


@pytest.mark.parametrize("argv, message", [
    (["--only", "train,nope"], "unknown sections"),
    (["--batch_size", "4,0"], "positive"),
    (["--seq_len", "512", "--block_size", "256"], "exceeds --block_size"),
    (["--n_embd", "30", "--n_head", "4"], "divisible"),
    (["--quick", "--preset", "gpt2-124M"], "pass one of them"),
    (["--hellaswag_context", "1,10"], "--hellaswag_context must be LO,HI with 2 <= LO <= HI"),
    (["--hellaswag_ending", "9,3"], "--hellaswag_ending must be LO,HI with 1 <= LO <= HI"),
    (["--only", "compare", "--compare_steps", "3", "--compare_skip", "3"], "--compare_skip must be in [0, --compare_steps)"),
    (["--only", "compare", "--compare_args", "--dtype 'float32"], "--compare_args"),
])
def test_bad_arguments_are_rejected(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        bench.parse_args(argv)
    assert e.value.code == 2
    assert message in capsys.readouterr().err


def test_a_revision_that_does_not_exist_is_one_line_before_any_work():
    """Checked when bench runs, not when its command parses: a shallow clone still parses the README's commands."""
    with pytest.raises(SystemExit) as e:
        bench.main(["--only", "compare", "--compare_rev", "no-such-rev"])
    assert str(e.value.code).startswith("bench.py: error: --compare_rev no-such-rev: no such commit in")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message given when there is no GPU")
def test_gpu_preset_without_a_gpu_says_what_to_do(tmp_path):
    with pytest.raises(SystemExit) as e:
        bench.main(["--preset", "gpt2-124M", "--json", str(tmp_path / "b.json")])
    assert "CUDA is not available" in str(e.value.code) and "--device cpu" in str(e.value.code)
    assert not (tmp_path / "b.json").exists()


def test_presets_and_overrides():
    quick = bench.parse_args(["--quick", "--batch_size", "3,5", "--only", "train"])
    assert quick.preset == "quick" and quick.batch_size == [3, 5] and quick.only == ["train"]
    gpu = bench.parse_args(["--preset", "gpt2-124M"])
    assert (gpu.n_layer, gpu.n_embd, gpu.batch_size, gpu.seq_len) == (12, 768, [16, 64], 1024)
    assert (gpu.device, gpu.dtype, gpu.compile) == ("cuda", "bfloat16", "true")
    default = bench.parse_args([])
    assert default.preset == "cpu" and default.only == list(bench.DEFAULT_SECTIONS)
    assert "compare" in bench.SECTIONS and "compare" not in bench.DEFAULT_SECTIONS
    assert (default.gen_shape, default.prompt_len, default.new_tokens) == ("gpt2-124M", 16, 256)


def test_format_table_aligns_columns():
    rows = [{"name": "a", "x": 1.5, "n": 1000}, {"name": "longer", "x": None, "n": 7}]
    text = bench.format_table("title", [("name", "name", "s"), ("x", "x (s)", ".2f"), ("n", "count", ",d")], rows)
    lines = text.splitlines()
    assert lines[0] == "title"
    assert len({len(line) for line in lines[1:]}) == 1  # fixed width
    assert lines[3].split() == ["a", "1.50", "1,000"] and lines[4].split() == ["longer", "-", "7"]


def test_import_does_no_work():
    code = "import bench, sys; assert not {'tiktoken', 'transformers', 'datasets', 'matplotlib'} & set(sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout == "" and proc.stderr == "", proc.stderr


COMPARE_TINY = ["--only", "compare", "--compare_steps", "3", "--compare_skip", "1", "--compare_repeats", "1",
                "--threads", "1", "--compare_args",
                "--n_layer 1 --n_head 1 --n_embd 16 --block_size 16 --seq_len 16 --batch_size 2 --total_batch_size 32"]


def commit_of_this_tree(tmp_path) -> str:
    """A commit of the files as they are now (edits and new files included, ignored ones not), made with a private
    index so the repository's index, HEAD and branches stay as they were: compare's "old" tree is then this code, in a
    clean checkout and in a fork with uncommitted edits alike."""
    env = {**os.environ, "GIT_INDEX_FILE": str(tmp_path / "index"), "GIT_AUTHOR_NAME": "test",
           "GIT_AUTHOR_EMAIL": "test@localhost", "GIT_COMMITTER_NAME": "test", "GIT_COMMITTER_EMAIL": "test@localhost"}
    def git(*args):
        return subprocess.run(["git", "-C", str(bench.HERE), *args], env=env, capture_output=True, text=True,
                              check=True).stdout.strip()
    git("add", "--all")
    return git("commit-tree", git("write-tree"), "-m", "the working tree, for test_compare_this_tree_against_itself")


@pytest.mark.slow
def test_compare_this_tree_against_itself(tmp_path, monkeypatch):
    """The same code run twice side by side: a speed-up near 1, identical losses, the temp trees removed."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    rev = commit_of_this_tree(tmp_path)
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    results = bench.main(COMPARE_TINY + ["--compare_rev", rev, "--json", str(tmp_path / "b.json")])
    assert results["failures"] == [] and list(results["sections"]) == ["compare"]
    r = results["sections"]["compare"]
    old, new = r["rows"]
    assert old["tree"] == rev and new["tree"].startswith("this tree (HEAD ")
    assert old["timed_steps"] == new["timed_steps"] == 2 and old["speedup"] == 1.0
    assert 0.2 < r["speedup"] < 5  # the same program: only the machine's load tells them apart
    assert r["max_abs_loss_diff"] == 0.0 and r["losses_match"] and len(old["losses"]) == 3
    assert old["losses"] == new["losses"] and old["final_loss"] == old["losses"][-1]
    assert r["enforced"] == (old["dtype"] == new["dtype"] == "float32")
    assert json.loads((tmp_path / "b.json").read_text())["sections"]["compare"]["speedup"] == r["speedup"]
    assert list(scratch.iterdir()) == []  # the exported tree, the shards and the runs' logs are gone


def test_compare_without_git_is_one_line(monkeypatch):
    monkeypatch.setenv("PATH", "")
    with pytest.raises(SystemExit) as e:
        bench.main(["--only", "compare"])
    assert str(e.value.code) == "bench.py: error: --compare_rev 6f26f28: git is not on PATH (compare reads the old " \
                                "revision with git archive)"


def test_parse_train_stdout_reads_old_and_new_step_lines():
    text = """7,242,624 parameters | 1 process(es) on cpu | float32 | compile False
total batch 2,048 tokens = 16 x 128 x 1 ranks x 1 micro-steps
step     0 | loss 10.767937 | lr 3.0000e-04 | norm 3.8190 |  9075.5 ms |       226 tok/s
step     1 | non-finite loss nan / grad norm nan: update skipped
step     1 | loss nan | lr 6.0000e-04 | norm nan |    12.5 ms |  163840 tok/s | MFU 41.00%
step     2 | val loss 10.1234
step     2 |  5000 tok/s | loss 10.5 | 123.4 ms
step     3/9 | loss 9.5 | lr 6.0000e-04 | norm 1.0 |    99.0 ms |     7000 tok/s | epoch 0.10 | 2s left
eval     4/9 | val loss 9.1
sampled bfloat16 text after the header: not a dtype
"""
    steps, dtype = bench.parse_train_stdout(text)
    assert dtype == "float32"
    assert [s["step"] for s in steps] == [0, 1, 2, 3]
    assert steps[3] == {"step": 3, "loss": 9.5, "ms": 99.0, "tok_per_s": 7000.0}
    assert steps[0] == {"step": 0, "loss": 10.767937, "ms": 9075.5, "tok_per_s": 226.0}
    assert steps[1]["ms"] == 12.5 and steps[1]["tok_per_s"] == 163840.0
    assert steps[2] == {"step": 2, "loss": 10.5, "ms": 123.4, "tok_per_s": 5000.0}
    assert bench.parse_train_stdout("1 | 1 process(es) | bfloat16\n")[1] == "bfloat16"
    assert bench.parse_train_stdout("")[1] == "unknown"
