"""bench.py: a CPU run of a tiny shape as a user runs it (its table and its JSON), bad flags as
one line, a stop signal as one line, and its no-cache baseline choosing the tokens that
GPT.generate's KV cache chooses. No timing is asserted: only the shape of the output."""

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import ROOT, child_env

import bench
from train_gpt2 import GPT, GPTConfig

HEADER = ["run", "B x T", "ms/step", "tok/s", "MFU", "peak MiB", "vs first"]
RUNS = ["train B=2", "train B=4", "generate, no cache", "generate, KV cache"]


def start(*flags):
    argv = [sys.executable, "bench.py", *map(str, flags)]
    pipes = dict(stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    return subprocess.Popen(argv, cwd=ROOT, env=child_env(), text=True, **pipes)


def table(stdout):
    """The cells of the markdown table's lines, its rule left out."""
    lines = [line for line in stdout.splitlines() if line.startswith("|")]
    assert set(lines[1]) <= {"|", "-"}, lines[1]
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[:1] + lines[2:]]


def test_a_cpu_run_prints_the_table_and_writes_the_json(tmp_path):
    out = tmp_path / "results" / "bench.json"  # its directory is made
    flags = ["--device", "cpu", "--preset", "tiny", "--batch_sizes", "2,4", "--steps", 2]
    proc = start(*flags, "--warmup", 1, "--new_tokens", 8, "--json", out)
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0 and stderr == "", stderr
    assert stdout.startswith("bench.py --preset tiny: 2 layers x 64, vocab 512; cpu")
    cells = table(stdout)
    assert cells[0] == HEADER and [row[0] for row in cells[1:]] == RUNS
    for row in cells[1:]:
        assert float(row[3].replace(",", "")) >= 0  # tok/s
        assert row[4] == ""  # no MFU on a CPU
        assert row[6].endswith("x")
    assert [row[1] for row in cells[1:]] == ["2 x 64", "4 x 64", "1 x 16+8", "1 x 16+8"]
    assert cells[1][6] == cells[3][6] == "1.00x"  # each section against its first row

    results = json.loads(out.read_text())
    assert list(out.parent.iterdir()) == [out]  # no temporary file left
    assert results["device"] == "cpu" and results["compile"] == "false"
    assert results["dtype"] == "float32" and results["config"]["vocab_size"] == 512
    assert isinstance(results["same_tokens"], bool)
    rows = results["rows"]
    assert [row["run"] for row in rows] == RUNS
    for row in rows:
        assert row["ms"] > 0 and row["tok_per_s"] > 0 and row["peak_mib"] > 0
        assert row["mfu"] is None
    # the ratio is the tok/s of the row over its section's first
    speedup = rows[3]["tok_per_s"] / rows[2]["tok_per_s"]
    assert rows[3]["ratio"] == pytest.approx(speedup)
    assert rows[1]["ratio"] == pytest.approx(rows[1]["tok_per_s"] / rows[0]["tok_per_s"])


def test_bad_flags_are_one_line(tmp_path):
    (tmp_path / "file").write_text("")
    cases = [
        (["--bogus"], "unrecognized arguments: --bogus"),
        (["--batch_sizes", "16,0"], "expected positive integers"),
        (["--json", tmp_path], "is a directory"),
        # before any benchmark runs: a directory cannot be made under a file
        (["--json", tmp_path / "file" / "out.json", "--device", "cpu"], "bench.py: error: "),
    ]
    if not torch.cuda.is_available():
        cases.append((["--device", "cuda"], "--device cuda: not usable here"))
    procs = [start(*flags) for flags, _ in cases]
    for proc, (flags, expected) in zip(procs, cases):
        out, err = proc.communicate(timeout=300)
        assert proc.returncode != 0 and out == "", (flags, out)
        assert err.count("\n") == 1 and err.startswith("bench.py: error: "), (flags, err)
        assert expected in err, (flags, err)


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc")
def test_a_stop_signal_is_one_line():
    proc = start("--device", "cpu", "--preset", "tiny", "--steps", 10**6)
    # once it catches SIGTERM (set before torch loads), then a moment later
    deadline = time.monotonic() + 60
    caught = 0
    while not caught >> (signal.SIGTERM - 1) & 1 and time.monotonic() < deadline:
        time.sleep(0.005)
        status = Path(f"/proc/{proc.pid}/status").read_text()
        caught = int(status.split("SigCgt:")[1].split()[0], 16)
    time.sleep(1)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM and out == ""
    assert err == "bench.py: stopped by SIGTERM\n"


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
    assert first == ["train B=64: out of memory", "64 x 1024", "", "", "", "", ""]
    second = [cell.strip() for cell in lines[3].strip("|").split("|")]
    assert second == ["a", "1 x 2", "2.00", "1,000", "50.0%", "", ""]


@pytest.mark.gpt2_contract
def test_flops_per_token_of_gpt2_124m():
    # 6 x (124,475,904 weights, padded vocab, less the 786,432 of the position table, a lookup)
    # + 12 x 12 layers x 768 x 1024 for attention
    with torch.device("meta"):
        model = GPT(GPTConfig(vocab_size=50304))
    assert bench.flops_per_token(model, 1024) == 6 * 123_689_472 + 12 * 12 * 768 * 1024


def test_flops_per_token_counts_an_untied_token_table_as_a_lookup():
    with torch.device("meta"):
        model = GPT(GPTConfig(block_size=16, vocab_size=64, n_layer=1, n_head=2, n_embd=8))
    tied = bench.flops_per_token(model, 16)
    model.lm_head.weight = torch.nn.Parameter(torch.empty(64, 8, device="meta"))
    # the head's matmul counts once; the token table, now only looked up, does not
    assert bench.flops_per_token(model, 16) == tied
