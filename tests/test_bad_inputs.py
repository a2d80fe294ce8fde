"""Bad input, as a new user types it: a non-zero exit, one `Error:` line naming the culprit, no
traceback, and no file left behind (output paths are checked before any work, written whole)."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from cli_helpers import run, run_bad
from conftest import cost_model, make_batch

from dcp.costmodel import Cluster, CostModel, load_hardware, load_model
from dcp.data import GlobalBatchSampler
from dcp.planner import IlpOptions, Sample, solve

ROOT = Path(__file__).resolve().parents[1]
PRESETS = ROOT / "dcp" / "presets"
FAST = ["--steps", "1", "--global-batch", "64"]


def inputs(where: Path) -> None:
    """The files the table's commands read."""
    (where / "big.txt").write_text("100\n99999999999999999999\n")
    (where / "empty_cell.csv").write_text("tokens,source\n100,a\n\n,b\n200,c\n")
    (where / "four.txt").write_text("100\n200\n300\n400\n")
    (where / "long.txt").write_text("1000\n9000000\n2000\n")
    (where / "a_dir").mkdir()
    hw = json.loads((PRESETS / "hardware" / "h200-sxm.json").read_text())
    (where / "string_memory.json").write_text(json.dumps(dict(hw, memory_capacity_bytes="80e9")))
    shutil.copy(ROOT / "notebooks" / "data" / "cpu-tiny-llama.json", where / "profile.json")  # a quick CPU profile
    (where / "binary.json").write_bytes(bytes(range(256)))
    run("plan", "--strategy", "dcp-greedy", "--gpus", "8", *FAST, "--format", "json", "-o", str(where / "plan.json"))
    plan = json.loads((where / "plan.json").read_text())
    groups = plan["steps"][0]["plan"]["groups"]  # the first sample of group 0 runs in the last group too
    groups[-1]["microbatches"][-1]["samples"].append(groups[0]["microbatches"][0]["samples"][0])
    (where / "dup.json").write_text(json.dumps(plan))
    groups[-1]["microbatches"][-1]["samples"].pop()
    plan["steps"][0]["plan"]["num_layers"] = 1000
    (where / "deep.json").write_text(json.dumps(plan))


# (arguments, what the one error line must say). `-o out.json` is added where the command
# writes a file, and must not exist afterwards.
CASES = [
    # Tracebacks before.
    (["plan", "--workload", "big.txt"], "big.txt line 2: length 99999999999999999999 is too large"),
    (["plan", "--time-limit", "inf"], "'--time-limit': inf is not a finite number"),
    (["plan", "--workload", "lognormal:size=2000000000"], "lognormal size=2000000000 is more than 10,000,000 samples"),
    # Misleading before.
    (["plan", "--workload", "a_dir"], "lengths file a_dir is a directory"),
    (["plan", "--workload", ""], "empty workload: use wikipedia"),
    (["plan", "--workload", "empty_cell.csv"], "empty_cell.csv line 4: empty, not a length"),
    (["plan", "--hardware", "string_memory.json"], "string_memory.json: hardware profile 'h200-sxm': memory_capacity_bytes "
                                                   "must be a number, got '80e9'"),
    (["plan", "--model", "profile.json"], "model file profile.json is a hardware profile, not a model spec: "
                                          "pass it as --hardware"),
    (["plan", "--model", "binary.json"], "model file binary.json: not a text file"),
    (["plan", "--seed", "-5"], "'--seed': -5 is not in the range x>=0"),
    (["profile", "--max-tokens", "64", "-o", "p.json"], "--max-tokens: 64 is below the default --min-tokens for cpu (256)"),
    (["plan", "--hardware", "profile.json", "--model", "tiny-llama", "--gpus", "8", "--workload", "wikipedia"],
     "profile longer sequences (dcp profile --max-tokens)"),
    # Silent before.
    (["plan", "--workload", "four.txt", "--global-batch", "4", "--steps", "5"],
     "--steps: 5 steps asked for, but four.txt's 4 samples make 1 full global batch of 4 samples"),
    (["plan", "--workload", "four.txt", "--steps", "1"],
     "--global-batch: workload four.txt holds 4 samples of 1,000 tokens, less than one global batch of 512"),
    (["plan", "--global-batch", "60000", "--steps", "2"],
     "--steps: 2 steps asked for, but wikipedia's 100,000 samples make 1 full global batch of 60,000 samples"),
    (["plan", "--global-tokens", "10", "--steps", "1"], "--global-tokens: global token budget 10 is less than sample"),
    (["plan", "--gpus", "32", "--gpus-per-node", "64"], "--gpus-per-node: 64 is more than --gpus 32"),
    (["show", "deep.json"], "plan is for a model of 1000 layers, the cost model's llama-7b has 32"),
    (["show", "dup.json"], "dup.json: step 0: sample "),  # in full: test_a_sample_run_twice_is_located
    (["compare", "--strategies", ""], "--strategies: no strategy given"),
    (["compare", "--strategies", "ilp,ilp"], "--strategies: 'ilp' is listed twice"),
    # Checked after the work before.
    (["plan", "-o", "no/such/dir/plan.json"], "-o: folder no/such/dir of no/such/dir/plan.json does not exist"),
    (["plan", "-o", "a_dir"], "'--output': File 'a_dir' is a directory"),
    (["compare", "--plot", "bars.nope"], "--plot: bars.nope: the extension must be one of .png, .svg, .pdf"),
    (["compare", "--plot", "no/dir/bars.png"], "--plot: folder no/dir of no/dir/bars.png does not exist"),
    (["show", "plan.json", "--gantt", "no/dir/g.png"], "--gantt: folder no/dir of no/dir/g.png does not exist"),
    (["show", "plan.json", "--gantt", "g.bmp"], "--gantt: g.bmp: the extension must be one of"),
    (["profile", "--device", "cpu", "--quick", "-o", "no/dir/p.json"], "-o: folder no/dir of no/dir/p.json"),
    # Written in the wrong format before (issue 56, item 4): a --format that contradicts -o's extension.
    (["plan", "--format", "table", "-o", "plan_out.json"], "--format: table contradicts -o plan_out.json (a .json file)"),
    (["compare", "--format", "json", "-o", "bars.csv"], "--format: json contradicts -o bars.csv (a .csv file)"),
    # Priced in silence, or advised what cannot help, before (issue 56, item 11).
    (["plan", "--hardware", "profile.json", "--model", "llama-7b", "--zero-stage", "3"],
     "hardware profile profile.json was fitted for tiny-llama, not llama-7b: add a fit with "
     "`dcp profile --model llama-7b --base profile.json -o profile.json`"),
    # ratchet: 1242.1 GB is the cost model's static_bytes for llama-70b at stage 0 in bf16 (by hand,
    # 18 B x 68,976,648,192 parameters = 1241.6 GB before FSDP2's units); 137.1 GB is derived:
    # 139.80 GiB x (1 - 0.07) - 2.5 GB (h200-sxm's capacity, reserve fraction and reserve).
    (["plan", "--model", "llama-70b", "--gpus", "8", "--zero-stage", "0"],
     "model states of llama-70b need 1242.1 GB per GPU at ZeRO stage 0 in bf16, more than the 137.1 GB usable; "
     "these fit them: --zero-stage 3 --gpus 16"),
    (["plan", "--model", "llama-70b", "--gpus", "8", "--zero-stage", "3", "--memory-gb", "1"],
     "and no ZeRO stage, precision recipe or GPU count (up to 1,048,576) brings them under it"),
    # Planning fails after the output was checked: nothing half-written either.
    (["plan", "--workload", "long.txt", "--global-batch", "3", "--gpus", "8"], "sample 1 (9000000 tokens) fits nowhere"),
]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    where = tmp_path_factory.mktemp("bad")
    inputs(where)
    return where


@pytest.mark.parametrize(("args", "culprit"), CASES, ids=[" ".join(a)[:60] for a, _ in CASES])
def test_bad_input_is_one_line_and_leaves_nothing(args: list[str], culprit: str, workdir: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(workdir)
    before = sorted(p.name for p in workdir.rglob("*"))
    writes = args[0] in ("plan", "compare") and "-o" not in args
    line = run_bad(*args, *(["--strategy", "bucket"] if args[0] == "plan" and "--strategy" not in args else []),
                   *(["-o", "out.json"] if writes else []))
    assert culprit in line, line
    assert sorted(p.name for p in workdir.rglob("*")) == before  # no output, no temporary file


def test_a_sample_run_twice_is_located(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The error names the file, the step and every micro-batch the sample runs in (issue 56, item 19)."""
    monkeypatch.chdir(workdir)
    groups = json.loads((workdir / "dup.json").read_text())["steps"][0]["plan"]["groups"]
    sample, last = groups[0]["microbatches"][0]["samples"][0], len(groups) - 1
    mb = len(groups[-1]["microbatches"]) - 1
    assert last > 0 and groups[-1]["microbatches"][-1]["samples"][-1] == sample
    assert run_bad("show", "dup.json") == (f"Error: dup.json: step 0: sample {sample} runs 2 times: "
                                           f"in group 0 micro-batch 0, group {last} micro-batch {mb}")


def test_profile_output_is_checked_before_measuring(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(workdir)
    result = run("profile", "--device", "cpu", "--quick", "-o", "no/dir/p.json", ok=False)
    assert result.exit_code == 2 and "does not exist" in result.output
    # Only click's usage lines and the error: no progress bar, no fit table, nothing measured.
    assert all(line.startswith(("Usage:", "Try ", "Error:")) for line in result.output.splitlines() if line.strip())


def test_cuda_without_a_gpu_is_one_line() -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert "--device: no CUDA device is visible to torch" in run_bad("profile", "--device", "cuda", "-o", "p.json")


@pytest.mark.parametrize("script", ["train_reference.py", "train_hf.py"])
def test_examples_without_torchrun_say_so(script: str) -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / script), "--steps", "1"], capture_output=True,
                          text=True, timeout=300, env={"PATH": "/usr/bin:/bin"})
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()]  # one line
    assert proc.stderr.startswith("Error: not started by torchrun") and f"torchrun --nproc_per_node N {script}" in proc.stderr


MISSING = "import sys; sys.modules[{name!r}] = None; "
"""Python code that makes `import name` fail, as on an install without the extra."""


@pytest.mark.parametrize(("code", "extra"), [
    ("import runpy; runpy.run_path('examples/train_hf.py', run_name='__main__')", "transformers"),
    ("import dcp.executor.hf", "transformers"),
    ("from dcp.data import read_lengths; open('x.parquet', 'wb').write(b'PAR1'); read_lengths('x.parquet')", "pyarrow"),
])
def test_a_missing_extra_is_named(code: str, extra: str, tmp_path: Path) -> None:
    name = {"transformers": "hf", "pyarrow": "parquet"}[extra]
    cwd = ROOT if "examples" in code else tmp_path
    proc = subprocess.run([sys.executable, "-c", MISSING.format(name=extra) + code], capture_output=True,
                          text=True, timeout=300, cwd=cwd)
    assert proc.returncode != 0
    assert f"dcp[{name}]" in proc.stderr or f".[{name}]" in proc.stderr, proc.stderr[-2000:]


# -- the library: solve and the sampler -------------------------------------------------------------


@pytest.mark.parametrize(("batch", "options", "message"), [
    ([Sample(0, -5, 0)], "bucket-per-batch", "sample 0: -5 tokens; a sample needs at least 1"),
    ([Sample(0, 0, 0)], "dcp-greedy", "sample 0: 0 tokens"),
    ([Sample(0, 2.5, 3)], "dcp-greedy", "sample 0: tokens 2.5 is not an integer"),
    ([Sample(0, 100, 7)], "dcp-greedy", "sample 0: attn_pairs 7 is outside [tokens, tokens * (tokens + 1)]"),
    ([Sample(0, 100, 5050, 3)], "dcp-greedy", "sample 0: 100 tokens do not split into 3 equal frames"),
    ([Sample(0, 100, 5050), Sample(0, 50, 1275)], "dcp-greedy", "batch lists sample 0 more than once"),
    ([100, -3], "dcp-greedy", "batch item 1: -3 tokens"),
    ([100, 2.5], "dcp-greedy", "batch item 1 is a float"),
    ("100", "dcp-greedy", "batch must be a sequence"),
    ([], "dcp-greedy", "cannot plan an empty batch"),
    ([100], "magic", "unknown strategy 'magic'"),
    ([100], 3, "options must be a strategy name or StrategyOptions, got int"),
    ([100], "bucket", "give dataset_longest_tokens"),
])
def test_solve_refuses_bad_inputs(batch: object, options: object, message: str) -> None:
    cm = cost_model(gpus=8)
    with pytest.raises(ValueError, match=_literal(message)):
        solve(batch, cm.cluster, cm, options)  # type: ignore[arg-type]


def _literal(text: str) -> str:
    return re.escape(text)


def test_solve_takes_token_counts_and_strategy_names() -> None:
    cm = cost_model(gpus=8)
    lengths = [300, 5000, 40_000, 12]
    reference = solve(make_batch(lengths), cm.cluster, cm, "dcp-greedy")
    assert solve(lengths, cm.cluster, cm, "dcp-greedy").digest() == reference.digest()
    assert solve(np.array(lengths), cm.cluster, cm, "dcp-greedy").digest() == reference.digest()


def test_ilp_time_limit_must_be_finite() -> None:
    with pytest.raises(ValueError, match="positive, finite number of seconds, got inf"):
        IlpOptions(time_limit_s=math.inf)


def _cm() -> CostModel:
    return CostModel(load_model("tiny-llama"), load_hardware("cpu"), Cluster(num_gpus=4, gpus_per_node=4,
                                                                            memory_bytes=1e9))


@pytest.mark.parametrize(("lengths", "kwargs", "message"), [
    ([100, 200], {"batch_size": 0}, "batch_size must be a positive integer, got 0"),
    ([100, 200], {"token_budget": -1}, "token_budget must be a positive integer, got -1"),
    ([100, 200], {"batch_size": 1.5}, "batch_size must be a positive integer, got 1.5"),
    ([100, 200], {"batch_size": 1, "seed": -5}, "seed must be an integer >= 0, got -5"),
    ([100, 200.5], {"batch_size": 1}, "sample 1: lengths 200.5 is not a whole number"),
    ([100, "x"], {"batch_size": 1}, "sample 1: lengths 'x' is not an integer"),
    ("missing.txt", {"batch_size": 1}, "lengths 'missing.txt': no such lengths file"),
    ([100], {"batch_size": 1, "strategy": "magic"}, "unknown strategy 'magic'"),
])
def test_sampler_refuses_bad_inputs(lengths: object, kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=_literal(message)):
        GlobalBatchSampler(lengths, _cm(), workers=0, **kwargs)  # type: ignore[arg-type]


def test_sampler_reads_a_lengths_file_and_whole_floats(tmp_path: Path) -> None:
    path = tmp_path / "lengths.txt"
    path.write_text("100\n\n200\n300\n")
    assert GlobalBatchSampler(str(path), _cm(), batch_size=2, workers=0).tokens.tolist() == [100, 200, 300]
    assert GlobalBatchSampler([100.0, 200.0], _cm(), batch_size=2, workers=0).tokens.tolist() == [100, 200]


def test_a_short_plan_timeout_does_not_block_starting_the_workers() -> None:
    """Starting a spawn worker takes seconds; plan_timeout_s bounds a plan, not that."""
    with GlobalBatchSampler([100, 200, 300, 400], _cm(), batch_size=2, strategy="dcp-greedy", workers=1,
                            plan_timeout_s=0.3) as sampler:
        plans = [b.plan for b in sampler]
    assert [len(p.samples) for p in plans] == [2, 2]


def test_static_baselines_size_for_the_sampler_data() -> None:
    """`bucket` by name fixes one SP size for the whole training: the longest sample's."""
    cm = _cm()
    lengths = [100] * 7 + [cm.max_tokens(1, cm.model.num_layers) + 1]  # needs SP 2
    with GlobalBatchSampler(lengths, cm, batch_size=2, strategy="bucket", workers=0) as sampler:
        sizes = {g.sp for b in sampler for g in b.plan.groups}
    with GlobalBatchSampler(lengths, cm, batch_size=2, strategy="bucket-per-batch", workers=0) as sampler:
        per_batch = {g.sp for b in sampler for g in b.plan.groups}
    assert sizes == {2} and per_batch == {1, 2}


# -- output files, exit codes (issue 56, items 4 and 7-10) ----------------------------------------------


@pytest.mark.parametrize(("command", "name"), [("plan", "p.json"), ("plan", "p.csv"), ("compare", "c.json"),
                                                ("compare", "c.csv"), ("plan", "p.txt")])
def test_the_output_format_follows_the_extension(command: str, name: str, tmp_path: Path) -> None:
    path = tmp_path / name
    extra = ["--strategy", "bucket"] if command == "plan" else ["--strategies", "bucket,packed"]
    run(command, *FAST, *extra, "-o", str(path))
    text = path.read_text()
    if name.endswith(".json"):
        doc = json.loads(text)
        assert ("steps" in doc) if command == "plan" else ("results" in doc)
    elif name.endswith(".csv"):
        import pandas as pd

        frame = pd.read_csv(path)
        assert ("group" in frame.columns) if command == "plan" else ("strategy" in frame.columns)
    else:  # no extension that names a format: the text table, as on stdout
        assert text.startswith("bucket on 32 x ") and "mean step" in text


@pytest.mark.parametrize("umask", [0o022, 0o077, 0o002])
def test_output_files_respect_the_umask(umask: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    old = os.umask(umask)
    try:
        run("plan", *FAST, "--strategy", "bucket", "-o", "p.json")
        run("show", "p.json", "--gantt", "g.png")
        run("compare", *FAST, "--strategies", "bucket,packed", "-o", "c.csv", "--plot", "c.svg")
    finally:
        os.umask(old)
    want = 0o666 & ~umask  # what open(..., "w") gives a new file
    modes = {name: (tmp_path / name).stat().st_mode & 0o777 for name in ("p.json", "g.png", "c.csv", "c.svg")}
    assert modes == dict.fromkeys(modes, want), {k: oct(v) for k, v in modes.items()}


def test_ctrl_c_exits_130_with_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import dcp.commands.planning as planning

    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt  # as Ctrl-C raises it in the middle of planning

    monkeypatch.setattr(planning, "plan_steps", interrupted)
    monkeypatch.chdir(tmp_path)
    result = run("plan", *FAST, "-o", "p.json", ok=False)
    assert result.exit_code == 130, result.output
    assert result.output.strip().splitlines() == ["Error: interrupted (Ctrl-C); no output file was written"]
    assert list(tmp_path.iterdir()) == []


BLOCKED_PLAN = """
import sys, threading
import dcp.commands.planning as planning
from dcp.cli import main

def blocked(*args, **kwargs):  # planning that never ends: only the signal stops it
    print("planning", file=sys.stderr, flush=True)
    threading.Event().wait()

planning.plan_steps = blocked
main(sys.argv[1:], prog_name="dcp")
"""
"""`dcp` in its own process, its planning replaced by a wait, so the signal surely lands mid-plan."""


def test_ctrl_c_in_a_real_process_exits_130(tmp_path: Path) -> None:
    """The signal itself (SIGINT, what Ctrl-C sends), delivered while `dcp plan` plans."""
    import signal

    cmd = [sys.executable, "-c", BLOCKED_PLAN, "plan", "--steps", "1", "--global-batch", "64", "-o", "p.json"]
    # A terminal delivers SIGINT; a runner started in the background (`cmd &` in a script) ignores
    # it, and a child inherits that. The child starts with the default action, as from a shell.
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert proc.stderr is not None
    assert proc.stderr.readline() == "planning\n"
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, (out, err)
    assert err.strip().splitlines() == ["Error: interrupted (Ctrl-C); no output file was written"], err
    assert list(tmp_path.iterdir()) == []


def test_a_failed_validation_exits_non_zero(monkeypatch: pytest.MonkeyPatch) -> None:
    import dcp.profiler.validate as validate
    from dcp.profiler.fitting import MAPE_THRESHOLD

    profile = str(ROOT / "notebooks" / "data" / "cpu-tiny-llama.json")
    for error, status in ((MAPE_THRESHOLD * 3, 1), (float("nan"), 1), (MAPE_THRESHOLD / 3, 0)):
        monkeypatch.setattr(validate, "validate_profile",
                            lambda *a, error=error, **k: validate.ValidationReport(model="tiny-llama", rows=[],
                                                                                  mape=error))
        result = run("profile", "--validate", profile, "--device", "cpu", ok=False)
        assert result.exit_code == status, result.output
        errors = [line for line in result.output.splitlines() if line.startswith("Error:")]
        assert len(errors) == status, result.output
        if status:
            assert "re-profile this machine" in errors[0] and "above 15%" in errors[0]


def test_presets_name_each_hardware_memory_source() -> None:
    from dcp.costmodel import load_hardware, preset_names

    out = run("presets").output
    assert "not given" not in out
    for name in preset_names("hardware"):
        source = " ".join(load_hardware(name).sources["memory_capacity_bytes"].split())
        assert source[:40] in " ".join(out.split()), name


# -- under torchrun: one line for the job (issue 56, item 14) ------------------------------------------

NO_TRANSFORMERS = """
import runpy, sys
sys.modules["transformers"] = None  # as on an install without the hf extra
sys.argv = ["examples/train_hf.py", "--steps", "1"]
runpy.run_path("examples/train_hf.py", run_name="__main__")
"""


@pytest.mark.parametrize("case", ["dcp profile on a GPU that is not there", "train_hf.py without transformers",
                                  "a bad option"])
def test_under_torchrun_an_error_prints_once(case: str, tmp_path: Path) -> None:
    import torch

    if case.startswith("dcp profile") and torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    script = tmp_path / "no_transformers.py"
    script.write_text(NO_TRANSFORMERS)
    args = {"dcp profile on a GPU that is not there": ["-m", "dcp.cli", "profile", "--device", "cuda", "-o", "p.json"],
            "train_hf.py without transformers": [str(script)],
            "a bad option": ["-m", "dcp.cli", "plan", "--gpus", "0"]}[case]
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "3", *args],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    out = proc.stdout + proc.stderr
    errors = [line for line in out.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, out
    want = {"dcp profile on a GPU that is not there": "no CUDA device is visible",
            "train_hf.py without transformers": "scripts/setup_env.sh hf", "a bad option": "'--gpus': 0"}[case]
    assert want in errors[0]
    status = 1 if case.startswith("train_hf") else 2  # click's usage errors exit 2
    assert proc.returncode != 0  # the failure is not hidden: torchrun itself exits 1
    # No traceback from our code: the one Python traceback is torchrun's own (its ChildFailedError),
    # all of whose frames are in torch or the torchrun script.
    assert out.count("Traceback (most recent call last)") <= 1, out
    frames = re.findall(r'File "([^"]+)"', out)
    assert all("/torch/" in f or "runpy" in f or f.endswith("torchrun") for f in frames), frames
    # torchrun's summary: rank 0 is the root cause with the run's status, and its error file carries
    # the one line. Every other rank that got as far as dcp exits with the same status; one that
    # torchrun ended while its interpreter was still starting (a loaded machine) can only show
    # torchrun's SIGTERM (-15): no handler of ours runs before dcp is imported.
    summary = proc.stderr.split("ChildFailedError", 1)[1]
    root = summary.split("Root Cause", 1)[1]
    assert re.search(r"rank\s*:\s*(\d+)", root).group(1) == "0", summary
    assert re.search(r"traceback\s*:\s*(.*)", root).group(1).strip() == errors[0], summary
    assert re.search(r"exitcode\s*:\s*(-?\d+)", root).group(1) == str(status), summary
    codes = re.findall(r"exitcode\s*:\s*(-?\d+)", summary)
    assert len(codes) == 3 and set(codes) <= {str(status), "-15"}, summary


END_JOB = """
import os, signal, sys, time
import dcp.cli_errors as c
c.LEAD_WAIT_S = 0.2
if sys.argv[1] == "ended":  # torchrun's SIGTERM arrives while the rank waits
    time.sleep = lambda s: os.kill(os.getpid(), signal.SIGTERM)
c.end_job(3, "Error: boom")
"""


@pytest.mark.parametrize(("rank", "how"), [("0", "waits"), ("1", "waits"), ("1", "ended")])
def test_end_job_under_torchrun(rank: str, how: str, tmp_path: Path) -> None:
    """Rank 0 prints and writes the error file; another rank ended by torchrun prints nothing and
    exits with the same status; another rank that rank 0 did not end reports the error as its own."""
    error_file = tmp_path / "error.json"
    env = dict(os.environ, RANK=rank, TORCHELASTIC_RUN_ID="t", TORCHELASTIC_ERROR_FILE=str(error_file))
    proc = subprocess.run([sys.executable, "-c", END_JOB, how], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 3, proc.stderr
    said = {"0": "Error: boom", "1": "" if how == "ended" else "Error: rank 1: boom"}[rank]
    assert proc.stderr.strip() == said and proc.stdout == ""
    shown = json.loads(error_file.read_text())["message"]["extraInfo"]["py_callstack"]
    assert shown == (said or "the same error as rank 0 (the root cause)")


@pytest.mark.parametrize(("flags", "room_gb"), [(["--gpus", "8", "--zero-stage", "0"], None),
                                                (["--gpus", "8", "--zero-stage", "1", "--precision", "fp32"], 40.0),
                                                (["--gpus", "8", "--zero-stage", "3"], 1.0)])
def test_memory_advice_offers_only_what_helps(flags: list[str], room_gb: float | None) -> None:
    """Every option the advice offers passes the model-states check when taken; when it offers none,
    a brute force over every stage, recipe and GPU count up to 2**20 finds none either."""
    from dcp.costmodel import RECIPES
    from dcp.planner.run import build_cost_model

    memory = ["--memory-gb", str(room_gb)] if room_gb else []
    line = run_bad("plan", "--model", "llama-70b", *flags, *memory, "--steps", "1", "--strategy", "bucket")
    assert "model states of llama-70b need" in line
    if "these fit them: " in line:
        offers = [o.split(" (")[0].split() for o in line.split("these fit them: ")[1].split("), ")]
        assert offers
        for offer in offers:
            taken = dict(zip(flags[::2], flags[1::2], strict=True))
            taken.update(dict(zip(offer[::2], offer[1::2], strict=True)))
            args = [x for kv in taken.items() for x in kv]
            result = run("plan", "--model", "llama-70b", *args, *memory, "--steps", "1", "--global-batch", "16",
                         "--strategy", "dcp-greedy", "--workload", "lognormal:mean=256,max=1024", ok=False)
            assert "model states" not in result.output, (offer, result.output)
    else:
        stage0 = int(flags[flags.index("--zero-stage") + 1])
        for stage in range(4):
            for recipe in RECIPES:
                for gpus in (8 * 2**k for k in range(18)):
                    cm = build_cost_model("llama-70b", "h200-sxm", gpus, None, room_gb, stage, recipe)
                    assert cm.static_bytes >= cm.cluster.memory_bytes, (stage, recipe, gpus, stage0)
