"""GPT-2 BPE from the shipped vocabulary: seed 004's ids, the hash check, no network."""

import hashlib

import pytest

from variantlab.data import tokenizer


def test_seed_004_sentence_ids():
    enc = tokenizer.gpt2_encoding()
    assert enc.encode("Every effort moves you") == [6109, 3626, 6100, 345]
    assert enc.n_vocab == 50257
    assert enc.decode([6109, 3626, 6100, 345]) == "Every effort moves you"


def test_endoftext_is_50256():
    assert tokenizer.encode("a<|endoftext|>b")[1] == 50256
    assert tokenizer.gpt2_encoding().eot_token == 50256


def test_shipped_file_has_the_known_hash():
    raw = tokenizer.vocabulary_bytes()
    assert len(raw) == 835_554
    assert hashlib.sha256(raw).hexdigest() == tokenizer.GPT2_SHA256


def test_corrupted_copy_fails_the_hash_check(tmp_path):
    raw = bytearray(tokenizer.vocabulary_bytes())
    raw[100] ^= 0x01  # flip one bit
    bad = tmp_path / "gpt2.tiktoken"
    bad.write_bytes(bytes(raw))
    with pytest.raises(tokenizer.VocabularyError, match="sha256") as info:
        tokenizer.encoding_from_bytes(tokenizer.vocabulary_bytes(bad), str(bad))
    assert str(bad) in str(info.value)
    assert tokenizer.GPT2_SHA256 in str(info.value)


def test_never_downloads(monkeypatch):
    import tiktoken.load

    def refuse(*args, **kwargs):
        raise AssertionError("tiktoken tried to fetch a file")

    monkeypatch.setattr(tiktoken.load, "read_file", refuse)
    monkeypatch.setattr(tiktoken.load, "read_file_cached", refuse)
    tokenizer.gpt2_encoding.cache_clear()
    assert tokenizer.gpt2_encoding().encode(" moves") == [6100]
