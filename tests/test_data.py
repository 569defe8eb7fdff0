"""Batches: deterministic for a seed, right shapes, folded ids, clear errors."""

import pytest
import torch

import variantlab as vl
from variantlab.data import sources as datalib
from variantlab.data.sources import StdlibData, SyntheticData, TextData
from variantlab.model.build import resolve_spec

REG = vl.get_registry()


@pytest.fixture
def spec(tiny):
    return resolve_spec(tiny, REG)


def same(a, b):
    return all(torch.equal(x.inputs["idx"], y.inputs["idx"]) and torch.equal(x.target, y.target)
               for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("source", [SyntheticData(), SyntheticData(task="recall")])
def test_synthetic_is_deterministic_and_shaped(spec, source):
    a = datalib.batches(source, spec, 3, 16, 2, seed=5, registry=REG)
    b = datalib.batches(source, spec, 3, 16, 2, seed=5, registry=REG)
    c = datalib.batches(source, spec, 3, 16, 2, seed=6, registry=REG)
    assert len(a) == 2
    assert a[0].inputs["idx"].shape == (3, 16) and a[0].target.shape == (3, 16)
    assert a[0].n_tokens == 48
    assert same(a, b) and not same(a, c)
    assert int(a[0].inputs["idx"].max()) < spec.vocab_size
    # the target is the input shifted by one
    assert torch.equal(a[0].inputs["idx"][:, 1:], a[0].target[:, :-1])


def test_batches_leave_the_global_rng_alone(spec):
    torch.manual_seed(1)
    expected = torch.rand(3)
    torch.manual_seed(1)
    datalib.batches(SyntheticData(), spec, 2, 8, 2, seed=0, registry=REG)
    assert torch.equal(torch.rand(3), expected)


def test_recall_answers_repeat_the_pairs():
    tokens = datalib.recall_tokens(4, 33, 64, generator=torch.Generator().manual_seed(0))
    assert tokens.shape == (4, 33)
    for seq in tokens.tolist():
        pairs = dict(zip(seq[0:16:2], seq[1:16:2]))  # 8 pairs: length // 4
        assert len(pairs) == 8 and all(k < 32 <= v for k, v in pairs.items())
        for q, v in zip(seq[16::2], seq[17::2]):
            assert pairs[q] == v


def test_text_source_tokenises_and_folds(tmp_path, spec):
    (tmp_path / "a.txt").write_text("Every effort moves you " * 40)
    (tmp_path / "b.txt").write_text("forward " * 40)
    got = datalib.batches(TextData(path="*.txt"), spec, 2, 8, 3, seed=0, base_dir=tmp_path, registry=REG)
    ids = got[0].inputs["idx"]
    assert ids.shape == (2, 8)
    stream = datalib.token_stream(tuple(str(p) for p in datalib.text_files("*.txt", tmp_path)))
    assert stream[:4].tolist() == [6109, 3626, 6100, 345]
    folded = set((stream % 64).tolist())
    assert set(ids.flatten().tolist()) <= folded
    assert 6109 % 64 in folded


def test_text_source_names_the_pattern_when_nothing_matches(tmp_path, spec):
    with pytest.raises(datalib.DataError, match=r"data.path 'corpus/\*\*/\*.md'"):
        datalib.batches(TextData(path="corpus/**/*.md"), spec, 2, 8, 1, seed=0, base_dir=tmp_path,
                        registry=REG)


def test_text_too_short_says_so(tmp_path, spec):
    (tmp_path / "t.txt").write_text("hi")
    with pytest.raises(datalib.DataError, match="fewer than seq_len"):
        datalib.batches(TextData(path="t.txt"), spec, 2, 8, 1, seed=0, base_dir=tmp_path, registry=REG)


def test_stdlib_corpus(spec):
    files = datalib.stdlib_files(5)
    assert len(files) == 5 and files == sorted(files)
    assert all(f.suffix == ".py" for f in files)
    a = datalib.batches(StdlibData(max_files=5), spec, 2, 16, 2, seed=3, registry=REG)
    b = datalib.batches(StdlibData(max_files=5), spec, 2, 16, 2, seed=3, registry=REG)
    assert same(a, b) and a[0].inputs["idx"].shape == (2, 16)


def test_stdlib_listing_skips_installed_packages_and_is_sorted(tmp_path, monkeypatch):
    for name in ["b/x.py", "a.py", "a/z.py", "a/notes.txt", "site-packages/pkg/p.py",
                 "b/dist-packages/q.py", "c/site-packages.py"]:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x = 1\n")
    monkeypatch.setattr(datalib, "_stdlib_root", lambda: tmp_path)
    datalib._stdlib_files.cache_clear()
    try:
        got = [str(p.relative_to(tmp_path)) for p in datalib.stdlib_files()]
    finally:
        datalib._stdlib_files.cache_clear()
    assert got == ["a/z.py", "a.py", "b/x.py", "c/site-packages.py"]  # Path order: by parts


def test_float_families_ignore_tokens():
    spec = resolve_spec({"family": "block", "emb_dim": 32, "n_heads": 4, "context_length": 16}, REG)
    got = datalib.batches(TextData(path="nothing/*.txt"), spec, 2, 8, 2, seed=0, registry=REG)
    assert got[0].inputs["x"].shape == (2, 8, 32)
    again = datalib.batches(None, spec, 2, 8, 2, seed=0, registry=REG)
    assert torch.equal(got[1].inputs["x"], again[1].inputs["x"])


def test_file_digest_follows_the_file_and_reads_an_unchanged_one_once(tmp_path, monkeypatch):
    """The digest cache keys a file by its stat (device, inode, size, mtime, ctime): an
    unchanged file is read once, under either of two paths to it; a rewrite of the same size
    whose mtime is put back is still seen (its ctime moved)."""
    import hashlib
    import os
    import time
    from pathlib import Path

    from variantlab.data import cache

    path = tmp_path / "a.txt"
    path.write_bytes(b"first version")
    reads: list[Path] = []
    real = Path.read_bytes
    monkeypatch.setattr(Path, "read_bytes", lambda self: reads.append(self) or real(self))
    first = cache.file_digest(path)
    assert first == hashlib.sha256(b"first version").hexdigest()
    link = tmp_path / "link.txt"
    link.symlink_to(path)
    assert cache.file_digest(tmp_path / "." / "a.txt") == cache.file_digest(link) == first
    assert len(reads) == 1
    st = path.stat()
    time.sleep(0.01)
    path.write_bytes(b"other version")  # the same size
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # and the old mtime
    assert path.stat().st_mtime_ns == st.st_mtime_ns
    assert cache.file_digest(path) == hashlib.sha256(b"other version").hexdigest()
    assert len(reads) == 2
    assert cache.files_hash([path, link]) != cache.files_hash([path])


def test_file_digest_tells_files_apart_where_the_file_system_has_no_inodes(tmp_path,
                                                                           monkeypatch):
    """Two files of the same size and times on a file system that reports inode 0 (some
    network and FAT mounts) keep their own digests: the path identifies them there."""
    import hashlib
    import os
    from pathlib import Path

    from variantlab.data import cache

    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_bytes(b"aaaa")
    b.write_bytes(b"bbbb")
    real = Path.stat

    def no_inode(self, *args, **kwargs):
        st = real(self, *args, **kwargs)
        fields = list(st)
        fields[1] = 0  # st_ino
        fields[7:10] = [1, 1, 1]  # the same atime, mtime and ctime
        return os.stat_result(fields, {f"st_{t}time_ns": 10**9 for t in "amc"})

    monkeypatch.setattr(Path, "stat", no_inode)
    assert a.stat().st_ino == 0 and a.stat().st_mtime_ns == b.stat().st_mtime_ns
    assert cache.file_digest(a) == hashlib.sha256(b"aaaa").hexdigest()
    assert cache.file_digest(b) == hashlib.sha256(b"bbbb").hexdigest()
