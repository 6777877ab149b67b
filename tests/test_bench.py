"""bench.py: a CPU run of a tiny shape as a user runs it (its table and its JSON), every bad flag
as one line before anything runs, and its no-cache baseline choosing the tokens that
GPT.generate's KV cache chooses. No timing is asserted: only the shape of the output."""

import json
import os

import pytest
import torch
from conftest import one_line_error, run_main, run_with_stdout_closed

import bench
from train_gpt2 import GPT, GPTConfig

HEADER = ["run", "B x T", "first s", "ms/step", "tok/s", "MFU", "peak MiB", "vs first"]
RUNS = ["train B=2", "train B=4", "val, eager", "generate, no cache", "generate, KV cache"]


def table(stdout):
    """The cells of the markdown table's lines, its rule left out."""
    lines = [line for line in stdout.splitlines() if line.startswith("|")]
    assert set(lines[1]) <= {"|", "-"}, lines[1]
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[:1] + lines[2:]]


def test_a_cpu_run_prints_the_table_and_writes_the_json(tmp_path, capsys):
    out = tmp_path / "results" / "bench.json"  # its directory is made
    flags = ["--device", "cpu", "--preset", "tiny", "--batch_sizes", "2,4", "--steps", 2]
    bench.main([str(a) for a in flags + ["--warmup", 1, "--new_tokens", 8, "--json", out]])
    stdout, stderr = capsys.readouterr()
    assert stderr == "", stderr
    assert stdout.startswith("bench.py --preset tiny: 2 layers x 64, vocab 512; cpu")
    cells = table(stdout)
    assert cells[0] == HEADER and [row[0] for row in cells[1:]] == RUNS
    for row in cells[1:]:
        assert float(row[4].replace(",", "")) >= 0  # tok/s
        assert row[5] == ""  # no MFU on a CPU
    shapes = ["2 x 64", "4 x 64", "4 x 64", "1 x 16+8", "1 x 16+8"]
    assert [row[1] for row in cells[1:]] == shapes
    # each section against its first row; evaluation's pieces against nothing
    assert cells[1][7] == cells[4][7] == "1.00x" and cells[3][7] == ""

    results = json.loads(out.read_text())
    assert list(out.parent.iterdir()) == [out]  # no temporary file left
    assert results["device"] == "cpu" and results["compile"] == "false"
    assert results["dtype"] == "float32" and results["config"]["vocab_size"] == 512
    assert isinstance(results["same_tokens"], bool)
    # what the numbers were measured with, printed above the table too
    assert results["environment"]["torch"] == torch.__version__
    assert "math" in results["environment"]["sdpa"] and results["environment"]["peak_flops"] is None
    assert stdout.splitlines()[1].startswith("CPU (")
    rows = results["rows"]
    assert [row["run"] for row in rows] == RUNS
    for row in rows:
        assert row["ms"] > 0 and row["tok_per_s"] > 0 and row["peak_mib"] > 0
        assert row["mfu"] is None
    assert rows[0]["first_s"] >= 0 and rows[2]["first_s"] >= 0 and "first_s" not in rows[3]
    # the ratio is the tok/s of the row over its section's first
    speedup = rows[4]["tok_per_s"] / rows[3]["tok_per_s"]
    assert rows[4]["ratio"] == pytest.approx(speedup)
    assert rows[1]["ratio"] == pytest.approx(rows[1]["tok_per_s"] / rows[0]["tok_per_s"])


def test_a_closed_stdout_still_writes_the_json(tmp_path):
    # `bench.py ... --json F | head -1` with the reader gone first: the table's printing ends
    # quietly, the results are written, exit 0 (no BrokenPipeError's traceback)
    out = tmp_path / "bench.json"
    flags = ["--device", "cpu", "--preset", "tiny", "--batch_sizes", 1, "--seq_len", 8]
    flags += ["--steps", 1, "--warmup", 0, "--new_tokens", 1, "--json", out]
    returncode, err = run_with_stdout_closed("bench.py", flags)
    assert returncode == 0 and err == "", err[-2000:]
    assert [row["run"] for row in json.loads(out.read_text())["rows"]][0] == "train B=1"


# Each a line on stderr before anything runs; --threads 100000 was a segmentation fault.
BAD_FLAGS = [
    (["--bogus"], "unrecognized arguments: --bogus"),
    (["--threads", "100000"], f"--threads must be 0 (torch's choice) to {os.cpu_count()}"),
    (["--threads", "-1"], "--threads must be 0"),
    (["--batch_sizes", "16,0"], "expected positive integers"),
    (["--batch_sizes", "16,1000000"], "--batch_sizes must be 1 to 4,096"),
    (["--seq_len", "0"], "--seq_len must be 1 to 65,536"),
    (["--seq_len", "10000000"], "--seq_len must be 1 to 65,536"),
    (["--steps", "0"], "--steps must be 1 to 10,000"),
    (["--steps", "1000000000"], "--steps must be 1 to 10,000"),
    (["--warmup", "-1"], "--warmup must be 0 to 10,000"),
    (["--new_tokens", "0"], "--new_tokens must be 1 to 65,536"),
    (["--seed", "-1"], "--seed must be 0 to 2**63 - 1"),
    (["--device", "tpu"], "--device tpu: not cpu, cuda, cuda:N or mps"),
    (["--json", "."], "--json . is a directory"),
    # (a FIFO, not a device: were the check lost, the rename would put a file in its place)
    (["--json", "{tmp}/fifo"], "--json {tmp}/fifo is not a regular file (a FIFO or a device?)"),
    (["--json", "{tmp}/file/out.json"], "--json {tmp}/file/out.json: {tmp}/file is a file, not a"),
    (["--json", "{tmp}/file/a/b.json"], "{tmp}/file is a file, not a directory: name a file in a"),
    # what bench.py did not write: a file of the user's, a run's record, anything in a run's
    # log_dir or a corpus
    (["--json", "{tmp}/file"], "--json {tmp}/file is a file but not bench.py's results"),
    (
        ["--json", "{tmp}/run/runs.jsonl"],
        "--json {tmp}/run/runs.jsonl is inside the run in {tmp}/run",
    ),
    (["--json", "{tmp}/run/new.json"], "--json {tmp}/run/new.json is inside the run in {tmp}/run"),
    (
        ["--json", "{tmp}/corpus/b.json"],
        "--json {tmp}/corpus/b.json is inside the corpus {tmp}/corpus",
    ),
]
if not torch.cuda.is_available():
    BAD_FLAGS.append((["--device", "cuda"], "--device cuda: this torch sees no CUDA GPU"))


@pytest.mark.parametrize("flags, message", BAD_FLAGS, ids=[" ".join(f) for f, _ in BAD_FLAGS])
def test_a_bad_flag_is_one_line(flags, message, capsys, tmp_path):
    # what --json may name: a FIFO, a path through a file, a file, a run's log_dir, a corpus
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "file").write_text("keep me")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "runs.jsonl").write_text("{}\n")
    (tmp_path / "corpus" / ".fineweb").mkdir(parents=True)
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    code, err = run_main(bench.main, [f.format(tmp=tmp_path) for f in flags], capsys)
    one_line_error(code, err, "bench.py", message.format(tmp=tmp_path))
    assert capsys.readouterr().out == ""
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus", "fifo", "file", "run"]


def test_only_benchs_own_results_are_replaced(tmp_path):
    (tmp_path / "old.json").write_text(json.dumps({"rows": [], "environment": {}}))
    (tmp_path / "other.json").write_text(json.dumps({"rows": []}))
    assert bench.is_results(tmp_path / "old.json")
    assert not bench.is_results(tmp_path / "other.json")


def test_a_json_that_cannot_be_written_loses_no_results(tmp_path, capsys, monkeypatch):
    # the file fails at the end (a full disk): the table is printed first, the line names the file
    def full_disk(path, write):
        raise OSError(f"cannot write {path}: [Errno 28] No space left on device")

    monkeypatch.setattr(bench.fineweb, "write_atomic", full_disk)
    flags = ["--device", "cpu", "--preset", "tiny", "--batch_sizes", 1, "--seq_len", 8]
    flags += ["--steps", 1, "--warmup", 0, "--new_tokens", 1, "--json", tmp_path / "out.json"]
    with pytest.raises(SystemExit) as exit:
        bench.main([str(a) for a in flags])
    out, err = capsys.readouterr()
    one_line_error(1, err + exit.value.code + "\n", "bench.py", "out.json: [Errno 28] No space")
    assert table(out)[0] == HEADER


def test_the_baseline_chooses_the_tokens_of_the_kv_cache():
    """Greedy decoding re-running the window, past block_size too, and GPT.generate with its
    cache agree; what the no-cache rows time is the same work."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=16, vocab_size=64, n_layer=2, n_head=2, n_embd=32)).eval()
    # larger weights: logits far apart, no near-ties to flip
    with torch.no_grad():
        model.lm_head.weight.mul_(20)
    prompt = torch.randint(0, 64, (2, 5))
    cached = model.generate(prompt, 20, temperature=0.0)
    assert torch.equal(bench.generate_uncached(model, prompt, 20), cached)
    assert cached.shape == (2, 25) and torch.equal(cached[:, :5], prompt)


def test_the_table_leaves_missing_values_blank():
    rows = [
        {"run": "train B=64: out of memory", "shape": "64 x 1024"},
        {"run": "a", "shape": "1 x 2", "ms": 2.0, "tok_per_s": 1000.0, "mfu": 0.5},
    ]
    bench.add_ratios(rows)
    lines = bench.markdown(rows).splitlines()
    assert len(lines) == 4 and len({len(line) for line in lines}) == 1  # padded
    first = [cell.strip() for cell in lines[2].strip("|").split("|")]
    assert first == ["train B=64: out of memory", "64 x 1024", "", "", "", "", "", ""]
    second = [cell.strip() for cell in lines[3].strip("|").split("|")]
    assert second == ["a", "1 x 2", "", "2.00", "1,000", "50.0%", "", ""]


@pytest.mark.gpt2_contract
def test_flops_per_token_of_gpt2_124m():
    # 6 x (124,475,904 weights, padded vocab, less the 786,432 of the position table, a lookup)
    # + 12 x 12 layers x 768 x 1024 for attention: the numerator of bench's and the trainer's MFU
    with torch.device("meta"):
        model = GPT(GPTConfig(vocab_size=50304))
    assert model.flops_per_token(1024) == 6 * 123_689_472 + 12 * 12 * 768 * 1024


def test_flops_per_token_counts_an_untied_token_table_as_a_lookup():
    with torch.device("meta"):
        model = GPT(GPTConfig(block_size=16, vocab_size=64, n_layer=1, n_head=2, n_embd=8))
    tied = model.flops_per_token(16)
    model.lm_head.weight = torch.nn.Parameter(torch.empty(64, 8, device="meta"))
    # the head's matmul counts once; the token table, now only looked up, does not
    assert model.flops_per_token(16) == tied
