"""Run checkpoints (dcp.executor.run_checkpoint): the commit protocol, keep-K, async copies, what
a checkpoint restores in one process, and every bad input named on every rank (2 gloo ranks)."""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
from checkpoint_helpers import DIGEST_PARTS, full_state, make_model, make_sampler, train_step
from dist_helpers import run_ranks
from torch.distributed.checkpoint import CheckpointException

from dcp.costmodel import load_model
from dcp.executor import run_checkpoint_files as files
from dcp.executor.run_checkpoint import Checkpointer, CheckpointError
from dcp.executor.run_checkpoint_state import run_digest


def _pair(seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2)).double()
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    return model, opt


def _step(model: torch.nn.Module, opt: torch.optim.Optimizer, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    model(torch.randn(3, 4, generator=g, dtype=torch.float64)).pow(2).sum().backward()
    opt.step()
    opt.zero_grad()


def _params(model: torch.nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def test_save_load_restores_model_optimizer_rng_and_run_state(tmp_path: Path) -> None:
    model, opt = _pair(0)
    for s in range(3):
        _step(model, opt, s)
    ckpt = Checkpointer(tmp_path, keep=2)
    random.seed(5), np.random.seed(6), torch.manual_seed(7)
    ckpt.save(3, model, opt, sampler_state={"epoch": 1, "step": 2}, refit={"fits": [1.5]}, extra={"lr": 0.1})
    draws = (random.random(), np.random.rand(), torch.rand(()).item())
    saved = _params(model)
    _step(model, opt, 3)  # the saved run goes on: its continuation is what a resume must reproduce
    want = _params(model)

    fresh, fresh_opt = _pair(1)  # other weights, no optimizer state yet
    random.seed(0), np.random.seed(0), torch.manual_seed(0)
    resumed = Checkpointer(tmp_path).load(fresh, fresh_opt)
    assert (resumed.step, resumed.sampler_state, resumed.refit, resumed.extra) == (3, {"epoch": 1, "step": 2},
                                                                                  {"fits": [1.5]}, {"lr": 0.1})
    assert all(torch.equal(a, b) for a, b in zip(_params(fresh), saved, strict=True))
    assert (random.random(), np.random.rand(), torch.rand(()).item()) == draws
    _step(fresh, fresh_opt, 3)  # Adam's moments and step count came back: the same update
    assert all(torch.equal(a, b) for a, b in zip(_params(fresh), want, strict=True))


def test_keep_last_k_and_latest(tmp_path: Path) -> None:
    model, opt = _pair(0)
    ckpt = Checkpointer(tmp_path, keep=2)
    assert ckpt.latest() is None
    for s in (1, 2, 3, 5):
        _step(model, opt, s)
        ckpt.save(s, model, opt)
    assert ckpt.steps() == [3, 5] and ckpt.latest() == 5
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-000000003", "step-000000005"]
    manifest = files.read_manifest(tmp_path / "step-000000005")
    on_disk = {p.name for p in (tmp_path / "step-000000005").iterdir()} - {files.MANIFEST}
    assert set(manifest["files"]) == on_disk and manifest["step"] == 5
    assert all(manifest["files"][n]["bytes"] == (tmp_path / "step-000000005" / n).stat().st_size for n in on_disk)


def test_async_save_copies_the_state_before_returning(tmp_path: Path) -> None:
    model, opt = _pair(0)
    _step(model, opt, 0)
    ckpt = Checkpointer(tmp_path, async_save=True)
    ckpt.save(1, model, opt)
    saved = _params(model)
    with torch.no_grad():  # training goes on while the write runs
        for p in model.parameters():
            p.add_(1.0)
    ckpt.wait()
    fresh, fresh_opt = _pair(1)
    Checkpointer(tmp_path).load(fresh, fresh_opt)
    assert all(torch.equal(a, b) for a, b in zip(_params(fresh), saved, strict=True))


def test_a_failed_save_leaves_the_last_committed_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model, opt = _pair(0)
    ckpt = Checkpointer(tmp_path)
    ckpt.save(1, model, opt)
    saved = _params(model)
    _step(model, opt, 1)
    original = files.CommittingWriter.finish

    def crash(self: files.CommittingWriter, **kwargs: object) -> None:
        files.FileSystemWriter.finish(self, **kwargs)  # .metadata written, then the process "dies"
        raise OSError("disk gone")

    monkeypatch.setattr(files.CommittingWriter, "finish", crash)
    with pytest.raises(CheckpointException, match="disk gone"):
        ckpt.save(2, model, opt)
    assert ckpt.steps() == [1] and files.partial_steps(tmp_path) == [2]
    fresh, fresh_opt = _pair(1)
    assert Checkpointer(tmp_path).load(fresh, fresh_opt).step == 1
    assert all(torch.equal(a, b) for a, b in zip(_params(fresh), saved, strict=True))
    monkeypatch.setattr(files.CommittingWriter, "finish", original)
    ckpt.save(3, model, opt)  # the next save clears the leftover
    assert ckpt.steps() == [1, 3] and files.partial_steps(tmp_path) == []


def test_digest_names_each_part() -> None:
    spec = load_model("tiny-llama")
    a = run_digest(model=spec, zero_stage=1, recipe="fp32")
    assert set(a) == {"model spec", "ZeRO stage", "precision recipe"} and a["model spec"].startswith("tiny-llama@")
    assert run_digest(model=spec, zero_stage=1, recipe="fp32") == a
    b = run_digest(model=load_model("tiny-stdit"), zero_stage=1, recipe="bf16")
    assert [k for k in a if a[k] != b[k]] == ["model spec", "precision recipe"]


def _bad_inputs(rank: int, world: int, root: str) -> dict[str, str | None]:
    """Save one good checkpoint, then try every kind of bad one; each load's error message (None:
    it loaded) and whether the model and optimizer kept their values through the failures."""
    d = Path(root)
    model = make_model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sampler = make_sampler(world)
    train_step(model, opt, [0, 1, 2, 3], rank, world)
    Checkpointer(d / "good", digest=run_digest(**DIGEST_PARTS)).save(1, model, opt, sampler_state=sampler.state_dict())
    train_step(model, opt, [4, 5, 6, 7], rank, world)  # differs from the checkpoint from now on
    before = full_state(model, opt)

    def broken(name: str, damage: object) -> Path:
        if rank == 0:
            shutil.copytree(d / "good", d / name)
            damage(d / name / "step-000000001")
        dist.barrier()
        return d / name

    def flip(path: Path) -> None:
        f = path / "__1_0.distcp"
        raw = bytearray(f.read_bytes())
        raw[len(raw) // 2] ^= 0xFF
        f.write_bytes(bytes(raw))

    def partial_only(path: Path) -> None:
        path.rename(path.parent / ".partial-step-000000001")

    errors: dict[str, str | None] = {}

    def attempt(name: str, ckpt: Checkpointer, m: torch.nn.Module = model, o: torch.optim.Optimizer = opt,
                s: object = sampler) -> None:
        try:
            ckpt.load(m, o, sampler=s)
            errors[name] = None
        except CheckpointError as e:
            errors[name] = str(e)

    digest = run_digest(**DIGEST_PARTS)
    attempt("recipe", Checkpointer(d / "good", digest={**digest, **run_digest(zero_stage=2, recipe="bf16")}))
    attempt("model spec", Checkpointer(d / "good", digest=run_digest(**{**DIGEST_PARTS,
                                                                         "model": load_model("tiny-stdit")})))
    deeper = make_model(num_layers=3)
    attempt("model", Checkpointer(d / "good"), deeper, torch.optim.AdamW(deeper.parameters(), lr=1e-2))
    other = make_sampler(world)
    other.fingerprint = "0123456789abcdef"  # as a sampler over other lengths would have
    attempt("sampler", Checkpointer(d / "good", digest=digest), s=other)
    attempt("missing", Checkpointer(broken("missing", lambda p: (p / "__1_0.distcp").unlink()), digest=digest))
    attempt("truncated", Checkpointer(broken("truncated", lambda p: (p / "__0_0.distcp").write_bytes(b"x")),
                                      digest=digest))
    attempt("corrupted", Checkpointer(broken("corrupted", flip), digest=digest))
    attempt("incomplete", Checkpointer(broken("incomplete", partial_only), digest=digest))
    attempt("empty", Checkpointer(d / "nothing-here", digest=digest))
    after = full_state(model, opt)
    errors["untouched"] = all(np.array_equal(before[k][n], after[k][n]) for k in before for n in before[k]
                              if not isinstance(before[k][n], dict)) and all(
        np.array_equal(before["optim"][f][n], after["optim"][f][n]) for f in before["optim"] for n in before["optim"][f])
    attempt("good", Checkpointer(d / "good", digest=digest))
    return errors


def test_bad_checkpoints_fail_on_every_rank_naming_what_differs(tmp_path: Path) -> None:
    results = run_ranks(_bad_inputs, 2, str(tmp_path), deadline_s=240)
    assert results[0] == results[1], "every rank must raise the same error"
    e = results[0]
    assert "ZeRO stage: checkpoint 3, this run 2" in e["recipe"] and "precision recipe: checkpoint fp32@" in e["recipe"]
    assert "model spec: checkpoint tiny-llama@" in e["model spec"] and "this run tiny-stdit@" in e["model spec"]
    assert "lacks" in e["model"] and "model.layers.2." in e["model"]
    assert "sampler was saved over other data" in e["sampler"]
    assert "__1_0.distcp is missing" in e["missing"]
    assert "__0_0.distcp has 1 bytes" in e["truncated"]
    assert "__1_0.distcp is corrupted" in e["corrupted"]
    assert "holds only an incomplete save (.partial-step-000000001" in e["incomplete"]
    assert "no checkpoint to resume from" in e["empty"]
    assert e["untouched"] is True, "a refused load must leave the model and optimizer as they were"
    assert e["good"] is None
