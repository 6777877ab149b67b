"""scripts/gpu_check.sh and gpu_check.py as the device machine runs them: the CPU smoke runs every
stage at toy sizes (a real torchrun run and its resume) and packs what it wrote into one
archive; in this process, a stage that fails is one line in the record and the next runs, a
tiny deadline skips the stages, a subprocess past the deadline is stopped, bad flags are one
line. The GPU's numbers need a GPU: this checks the program, not them."""

import json
import sys
import tarfile
import time

import gpu_check
import pytest
import torch
from conftest import ROOT, child_env, one_line_error, run_main, run_program

STAGES = ["preflight", "correct_fp32", "correct_bf16", "correct_compiled"]
STAGES += ["step_B4", "step_B2", "step_B1", "val", "hellaswag", "samples", "eval_share"]
STAGES += ["train", "resume"]


def records(out):
    """The one run's results.jsonl under out, every line a JSON object."""
    [run_dir] = out.glob("run_*")
    return [json.loads(line) for line in (run_dir / "results.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_the_cpu_smoke_runs_every_stage_and_packs_one_archive(tmp_path):
    env = child_env(PYTHON=sys.executable)
    proc = run_program(
        ["bash", ROOT / "scripts" / "gpu_check.sh"], [tmp_path / "check", "--cpu-smoke"], env=env
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    entries = records(tmp_path / "check")
    assert [e["stage"] for e in entries] == STAGES
    assert all(e["status"] == "ok" and e["seconds"] >= 0 for e in entries), entries
    found = {e["stage"]: e["result"] for e in entries}
    assert found["step_B4"]["attention"] in ("flash", "efficient", "math")
    assert found["val"]["tokens"] == 8 * 4 * 32
    assert found["hellaswag"]["run"] == "HellaSwag" and found["samples"]["run"] == "samples"
    # evaluation's share at the recipe's cadence, from the pieces just measured
    share = found["eval_share"]
    pieces = share["val_s"] + share["hellaswag_s"] + share["samples_s"] + share["once_s"]
    assert share["share"] == pytest.approx(pieces / (pieces + share["train_s"]))
    # 19,073 steps: val every 1,000 and at the end, HellaSwag and samples every 2,000
    assert share["evaluations"] == [21, 11, 11]
    assert found["resume"]["loop_ms"] > 0
    # the table, printed at the end too
    [run_dir] = (tmp_path / "check").glob("run_*")
    table = (run_dir / "table.md").read_text()
    assert [line.split(" | ")[0][2:] for line in table.splitlines()[4:]] == STAGES
    assert proc.stdout.endswith(table)
    # one archive of it all, checkpoints and shards left out
    with tarfile.open(tmp_path / "check.tgz") as archive:
        names = archive.getnames()
    assert f"check/{run_dir.name}/results.jsonl" in names
    assert f"check/{run_dir.name}/resume.log" in names
    assert not [name for name in names if name.endswith((".pt", ".npy"))]


def fake_stages(check):
    # the real preflight, then a stage that raises, one that finds a problem, one that is fine
    def boom(check):
        raise RuntimeError("CUDA error: an illegal memory access\nwas encountered")

    return [
        ("preflight", 5, lambda check: gpu_check.bench.environment(check.device)),
        ("boom", 1, boom),
        ("problem", 1, lambda check: dict(problem="out of tolerance", value=1.5)),
        ("after", 1, lambda check: dict(value=0.25)),
    ]


def test_a_failing_stage_is_one_line_and_the_next_runs(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(gpu_check, "stages", fake_stages)
    code, err = run_main(gpu_check.main, ["--cpu-smoke", "--out", tmp_path], capsys)
    [run_dir] = tmp_path.glob("run_*")
    one_line_error(code, "gpu_check.py: error: " + err, "gpu_check.py")
    assert err.strip() == f"gpu_check.py: failed: boom, problem (see {run_dir}/results.jsonl)"
    entries = records(tmp_path)
    assert [e["status"] for e in entries] == ["ok", "failed", "failed", "ok"]
    assert (
        entries[1]["error"] == "RuntimeError: CUDA error: an illegal memory access was encountered"
    )
    assert entries[2]["result"] == dict(problem="out of tolerance", value=1.5)
    rows = (run_dir / "table.md").read_text().splitlines()[4:]
    assert rows[1] == f"| boom | failed | {entries[1]['seconds']:.4g} | {entries[1]['error']} |"
    assert rows[3].endswith("| value 0.25 |")


def test_a_tiny_deadline_skips_every_stage_but_the_preflight(tmp_path):
    gpu_check.main(["--cpu-smoke", "--out", str(tmp_path), "--deadline", "1"])
    entries = records(tmp_path)
    assert [e["stage"] for e in entries] == STAGES
    assert [e["status"] for e in entries] == ["ok"] + ["skipped"] * (len(STAGES) - 1)
    assert entries[1]["reason"].startswith("needs ~10 s, ")
    assert entries[1]["reason"].endswith(" s left before the deadline")


def test_a_subprocess_past_the_deadline_is_stopped(tmp_path):
    check = gpu_check.Check(gpu_check.SIZES["cpu"], "cpu", "eager", tmp_path, time.monotonic() + 1)
    started = time.monotonic()
    with pytest.raises(TimeoutError, match="stopped at the deadline; its output: sleep.log"):
        gpu_check.run_logged(
            check, [sys.executable, "-c", "import time; time.sleep(60)"], "sleep.log"
        )
    assert time.monotonic() - started < 30


BAD_FLAGS = [
    (["--deadline", "0"], "--deadline must be 0 to 3600 seconds"),
    (["--deadline", "1e9"], "--deadline must be 0 to 3600 seconds"),
    (["--cpu_smoke"], "unrecognized arguments: --cpu_smoke"),
]
if not torch.cuda.is_available():
    BAD_FLAGS.append(([], f"torch {torch.__version__} sees no CUDA GPU: run it on one"))


@pytest.mark.parametrize("flags, message", BAD_FLAGS, ids=[" ".join(f) for f, _ in BAD_FLAGS])
def test_a_bad_start_is_one_line_and_writes_nothing(flags, message, tmp_path, capsys):
    code, err = run_main(gpu_check.main, ["--out", tmp_path / "out", *flags], capsys)
    one_line_error(code, err, "gpu_check.py", message)
    assert not (tmp_path / "out").exists()


def test_the_reference_holds_both_cases():
    """Made on a CPU in fp32 by --make-reference: 124M for the GPU, tiny for its test."""
    reference = json.loads(gpu_check.REFERENCE.read_text())
    assert reference["made_with"]["dtype"] == "float32"
    for name, case in reference["cases"].items():
        assert case["model"]["vocab_size"] == 50304 and case["steps"] == 3, name
        assert len(case["losses"]) == 4 and case["losses"][-1] < case["losses"][0]
        assert len(case["logits"]) == case["B"] * 2 * 8 and case["init"] > 0


@pytest.mark.gpt2_contract
def test_the_cpu_makes_gpt2s_reference(one_thread):
    # what the GPU runs are held to is this model's, in float32 on a CPU (after an edit of the
    # model: python scripts/gpu_check.py --make-reference). The tiny case: the 124M one comes
    # from the same run_case and the same GPT-2 vocabulary, at 20 s of a 2-core CPU.
    reference = json.loads(gpu_check.REFERENCE.read_text())["cases"]["tiny"]
    got = gpu_check.run_case("tiny", "cpu", False, None)
    assert got["init"] == pytest.approx(reference["init"], rel=1e-9)
    assert got["losses"] == pytest.approx(reference["losses"], rel=1e-5)
    assert got["logits"] == pytest.approx(reference["logits"], abs=1e-4)
