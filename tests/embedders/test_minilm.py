"""Tests of the optional all-MiniLM-L6-v2 int8 ONNX embedder (needs the ``minilm`` extra)."""

from __future__ import annotations

import asyncio
import sys

import numpy as np
import pytest

from pgmemory.embedders.base import Embedder
from pgmemory.embedders.minilm import MAX_SEQ_LENGTH, MiniLMEmbedder
from pgmemory.errors import InvalidInputError


@pytest.fixture(scope="module")
def embedder() -> MiniLMEmbedder:
    """One embedder shared by the module (the model loads once, on first use)."""
    return MiniLMEmbedder()


def _cos(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))


def test_satisfies_protocol(embedder: MiniLMEmbedder) -> None:
    assert isinstance(embedder, Embedder)
    assert embedder.model_id == "sentence-transformers/all-MiniLM-L6-v2@onnx-int8"
    assert embedder.dimensions == 384


async def test_shape_dtype_and_unit_norm(embedder: MiniLMEmbedder) -> None:
    texts = ["Hello world.", "PostgreSQL stores the vectors.", "", "a"]
    vectors = await embedder.embed(texts)
    assert vectors.shape == (4, 384)
    assert vectors.dtype == np.float32
    assert vectors.flags.c_contiguous
    assert np.isfinite(vectors).all()
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)


async def test_accepts_any_sequence(embedder: MiniLMEmbedder) -> None:
    from_tuple = await embedder.embed(("one", "two"))
    from_list = await embedder.embed(["one", "two"])
    np.testing.assert_array_equal(from_tuple, from_list)


async def test_paraphrase_closer_than_unrelated(embedder: MiniLMEmbedder) -> None:
    anchor, paraphrase, unrelated = await embedder.embed(
        [
            "How do I reset my password?",
            "I forgot my login credentials and need to recover my account.",
            "The recipe calls for two cups of flour and a pinch of salt.",
        ]
    )
    close, far = _cos(anchor, paraphrase), _cos(anchor, unrelated)
    assert close > far + 0.3, (close, far)


async def test_matches_sentence_transformers_reference(embedder: MiniLMEmbedder) -> None:
    # sentence-transformers' quickstart with the float all-MiniLM-L6-v2 prints
    # [[1, 0.6660, 0.1046], [0.6660, 1, 0.1411], [0.1046, 0.1411, 1]].
    vectors = await embedder.embed(
        ["The weather is lovely today.", "It's so sunny outside!", "He drove to the stadium."]
    )
    similarities = vectors @ vectors.T
    expected = np.array([[1.0, 0.6660, 0.1046], [0.6660, 1.0, 0.1411], [0.1046, 0.1411, 1.0]])
    np.testing.assert_allclose(similarities, expected, atol=0.01)


async def test_batch_equals_single(embedder: MiniLMEmbedder) -> None:
    texts = [
        "short",
        "A considerably longer sentence, so that the batch needs padding for the short ones.",
        "",
        "medium length text about memory",
        "word " * 400,
    ]
    batch = await embedder.embed(texts)
    singles = np.vstack([await embedder.embed([text]) for text in texts])
    np.testing.assert_allclose(batch, singles, atol=1e-5)


async def test_sub_batches_keep_input_order(embedder: MiniLMEmbedder) -> None:
    # Lengths deliberately unsorted, and more texts than one sub-batch holds.
    texts = [("token " * n).strip() + f" {n}" for n in (30, 1, 17, 5, 60, 2, 9, 44, 3)]
    small_batches = MiniLMEmbedder(batch_size=2)
    expected = np.vstack([await embedder.embed([text]) for text in texts])
    np.testing.assert_allclose(await small_batches.embed(texts), expected, atol=1e-5)


async def test_duplicates_get_identical_vectors(embedder: MiniLMEmbedder) -> None:
    vectors = await embedder.embed(["same text", "other", "same text"])
    np.testing.assert_allclose(vectors[0], vectors[2], atol=1e-6)


async def test_long_text_is_truncated(embedder: MiniLMEmbedder) -> None:
    head = " ".join(f"w{i % 50}" for i in range(600))  # far beyond 256 word pieces
    assert len(embedder._tokenizer.encode(head).ids) == MAX_SEQ_LENGTH
    tail_a = head + " completely different ending about astronomy and stars"
    tail_b = head + " nothing alike: a recipe for bread with yeast"
    a, b = await embedder.embed([tail_a, tail_b])
    assert np.isfinite(a).all()
    # Everything after the first 256 word pieces is cut, so the endings do not count.
    np.testing.assert_allclose(a, b, atol=1e-6)


async def test_max_length_is_configurable() -> None:
    short = MiniLMEmbedder(max_length=8)
    base = "one two three four five six"  # 6 words -> 8 word pieces with [CLS] [SEP]
    a, b = await short.embed([base, base + " seven eight nine"])
    np.testing.assert_allclose(a, b, atol=1e-6)


async def test_empty_batch_does_not_load_model() -> None:
    fresh = MiniLMEmbedder()
    vectors = await fresh.embed([])
    assert vectors.shape == (0, 384)
    assert vectors.dtype == np.float32
    assert fresh._session is None  # still lazy


async def test_loads_lazily_and_once_under_concurrency() -> None:
    fresh = MiniLMEmbedder()
    assert fresh._session is None
    results = await asyncio.gather(*(fresh.embed([f"text {i}"]) for i in range(6)))
    session = fresh._session
    assert session is not None
    assert all(r.shape == (1, 384) for r in results)
    await fresh.embed(["again"])
    assert fresh._session is session


async def test_more_threads_same_vectors(embedder: MiniLMEmbedder) -> None:
    texts = ["threads should not change the result", "second text"]
    two = MiniLMEmbedder(threads=2)
    np.testing.assert_allclose(await two.embed(texts), await embedder.embed(texts), atol=1e-5)


async def test_rejects_bare_string(embedder: MiniLMEmbedder) -> None:
    with pytest.raises(InvalidInputError):
        await embedder.embed("not a list")  # type: ignore[arg-type]


async def test_rejects_non_string_item(embedder: MiniLMEmbedder) -> None:
    with pytest.raises(InvalidInputError, match=r"texts\[1\]"):
        await embedder.embed(["fine", 42])  # type: ignore[list-item]


@pytest.mark.parametrize(
    "kwargs",
    [{"threads": 0}, {"threads": True}, {"batch_size": 0}, {"max_length": 257}, {"max_length": 2}],
)
def test_rejects_bad_options(kwargs: dict[str, int]) -> None:
    with pytest.raises(InvalidInputError):
        MiniLMEmbedder(**kwargs)


def test_missing_extra_gives_install_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # makes `import onnxruntime` fail
    with pytest.raises(ImportError, match=r"pip install 'pgmemory-agents\[minilm\]'"):
        MiniLMEmbedder()
