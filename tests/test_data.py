"""Lengths files, built-in workloads and global batches."""

from __future__ import annotations

import gzip
from collections import Counter

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dcp.costmodel import attention_pairs
from dcp.data import (
    Workload,
    WorkloadError,
    global_batches,
    load_workload,
    lognormal,
    opensora,
    read_lengths,
)
from dcp.data.workloads import opensora_tokens


@pytest.mark.parametrize(("name", "text"), [
    ("a.txt", "5\n\n17\n3\n"),
    ("a.csv", "tokens\n5\n17\n3\n"),
    ("a.csv", "5\n17\n3\n"),  # a single column may omit the header
    ("b.csv", "id,tokens\n0,5\n1,17\n2,3\n"),
    ("a.jsonl", '{"tokens": 5}\n{"tokens": 17, "id": 1}\n\n{"tokens": 3}\n'),
])
def test_read_lengths_formats(tmp_path, name: str, text: str) -> None:
    path = tmp_path / name
    path.write_text(text)
    assert read_lengths(path).tolist() == [5, 17, 3]


def test_read_lengths_gzip(tmp_path) -> None:
    path = tmp_path / "a.txt.gz"
    with gzip.open(path, "wt") as f:
        f.write("5\n17\n3\n")
    assert read_lengths(path).tolist() == [5, 17, 3]
    assert load_workload(str(path)).tokens.tolist() == [5, 17, 3]


@pytest.mark.parametrize(("name", "text", "message"), [
    ("a.txt", "5\nabc\n3\n", "line 2: 'abc' is not an integer length"),
    ("a.txt", "5\n-3\n", "line 2: length -3 must be positive"),
    ("a.txt", "5\n0\n", "length 0 must be positive"),
    ("a.txt", "\n\n", "holds no lengths"),
    ("a.csv", "tokens\n5\n-7\n", "line 3: length -7 must be positive"),
    ("a.csv", "-4\n5\n", "line 1: length -4 must be positive"),
    ("a.csv", "a,b\n1,2\n", "no 'tokens' column"),
    ("a.jsonl", '{"tokens": 5}\n{"len": 3}\n', "line 2: no 'tokens' field"),
    ("a.jsonl", '{"tokens": 5}\n{oops\n', "line 2: not valid JSON"),
    ("a.jsonl", '{"tokens": -2}\n', "line 1: length -2 must be positive"),
    ("a.lengths", "5\n", "unknown format"),
])
def test_read_lengths_rejects_bad_files(tmp_path, name: str, text: str, message: str) -> None:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(WorkloadError, match=message):
        read_lengths(path)


def test_missing_file_is_named(tmp_path) -> None:
    with pytest.raises(WorkloadError, match="does not exist"):
        read_lengths(tmp_path / "nope.txt")


def test_workload_rejects_non_positive_lengths() -> None:
    with pytest.raises(WorkloadError, match="sample 1 has non-positive length -5"):
        Workload("w", np.array([3, -5]), np.ones(2, dtype=np.int64))


def test_opensora_720p_408_frames() -> None:
    # 408 frames -> 408 * 5 // 17 = 120 latent frames; 720/8/2 x 1280/8/2 = 45 x 80 tokens each.
    assert opensora_tokens(720, 1280, 408) == (120, 3600)
    assert 120 * 3600 == 432_000
    assert opensora_tokens(144, 256, 1) == (1, 144)  # an image stays one frame


def test_opensora_workload() -> None:
    w = opensora("balanced", size=2000, seed=0)
    assert len(w) == 2000
    assert w.tokens.max() <= 432_000
    assert (w.tokens % w.frames == 0).all()
    assert (w.frames == 1).sum() == 1000  # half images
    s = w.samples("spatial_temporal", np.array([int(np.argmax(w.tokens))]))[0]
    assert s.attn_pairs == attention_pairs("spatial_temporal", s.tokens, s.frames)
    long, short = opensora("long", size=2000), opensora("short", size=2000)
    assert long.tokens.mean() > short.tokens.mean()


def test_load_workload_specs() -> None:
    assert len(load_workload("wikipedia")) == 100_000
    assert load_workload("opensora-long", seed=1).name == "opensora-long"
    assert load_workload("opensora:short").name == "opensora-short"
    w = load_workload("lognormal:mean=512,sigma=1,min=64,max=4096,size=500")
    assert len(w) == 500 and w.tokens.min() >= 64 and w.tokens.max() <= 4096


@pytest.mark.parametrize(("spec", "message"), [
    ("wikipedia2", "unknown workload 'wikipedia2'"),
    ("lognormal:mean=1,foo=2", r"unknown parameter\(s\) \['foo'\]"),
    ("lognormal:mean=abc", "is not a finite number"),
    ("lognormal:sigma=-1", "lognormal needs"),
    ("opensora:huge", "unknown opensora variant 'huge'"),
    ("missing_lengths.txt", "does not exist"),
])
def test_bad_workload_specs(spec: str, message: str) -> None:
    with pytest.raises(WorkloadError, match=message):
        load_workload(spec)


def _small_workload(seed: int, size: int) -> Workload:
    return lognormal(mean=300, sigma=1.2, min_tokens=1, max_tokens=5000, size=size, seed=seed)


@given(seed=st.integers(0, 10_000), size=st.integers(1, 300), batch=st.integers(1, 64))
def test_batches_by_count_cover_every_sample_once(seed: int, size: int, batch: int) -> None:
    w = _small_workload(seed, size)
    batches = global_batches(w, "causal", batch_size=batch, seed=seed)
    ids = Counter(s.id for b in batches for s in b)
    assert sorted(ids) == list(range(size)) and set(ids.values()) == {1}
    assert all(len(b) == batch for b in batches[:-1]) and 0 < len(batches[-1]) <= batch


@given(seed=st.integers(0, 10_000), size=st.integers(1, 300), budget=st.integers(1, 20_000))
def test_batches_by_tokens_cover_every_sample_once(seed: int, size: int, budget: int) -> None:
    w = _small_workload(seed, size)
    batches = global_batches(w, "causal", token_budget=budget, seed=seed)
    ids = Counter(s.id for b in batches for s in b)
    assert sorted(ids) == list(range(size)) and set(ids.values()) == {1}
    for b in batches:
        assert len(b) == 1 or sum(s.tokens for s in b) <= budget


def test_batches_are_seeded_and_limited_by_steps() -> None:
    w = _small_workload(0, 1000)
    a = global_batches(w, "causal", batch_size=10, steps=3, seed=7)
    b = global_batches(w, "causal", batch_size=10, steps=3, seed=7)
    c = global_batches(w, "causal", batch_size=10, steps=3, seed=8)
    assert len(a) == 3 and a == b and a != c
    assert len(global_batches(w, "causal", token_budget=3000, steps=2)) == 2


@pytest.mark.parametrize(("kwargs", "message"), [
    ({}, "exactly one"),
    ({"batch_size": 4, "token_budget": 100}, "exactly one"),
    ({"batch_size": 0}, "global batch size must be positive"),
    ({"token_budget": -1}, "token budget must be positive"),
    ({"batch_size": 4, "steps": 0}, "steps must be positive"),
])
def test_bad_batch_requests(kwargs: dict, message: str) -> None:
    with pytest.raises(WorkloadError, match=message):
        global_batches(_small_workload(0, 10), "causal", **kwargs)
