"""Configuration, read from the environment (prefix ``PGMEMORY_``) and an optional ``.env`` file."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import platformdirs
from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict


def _default_data_dir() -> Path:
    return platformdirs.user_data_path("pgmemory") / "pgdata"


class Settings(BaseSettings):
    """Every knob pgmemory reads; each field is also ``PGMEMORY_<FIELD>`` in the environment.

    Leave ``database_url`` unset to run on the embedded PostgreSQL server under ``data_dir``.
    Secrets are :class:`~pydantic.SecretStr` and never appear in logs or reprs.
    """

    model_config = SettingsConfigDict(
        env_prefix="PGMEMORY_", env_file=".env", env_file_encoding="utf-8", extra="ignore"
    )

    database_url: SecretStr | None = Field(
        default=None,
        description="SQLAlchemy/libpq URL of a PostgreSQL server with pgvector; unset = embedded server.",
    )
    data_dir: Path = Field(
        default_factory=_default_data_dir, description="Data directory of the embedded server."
    )
    pool_size: int = Field(default=5, ge=1, description="Connections kept open in the pool.")
    max_overflow: int = Field(default=5, ge=0, description="Extra connections allowed above pool_size.")
    pool_timeout_s: float = Field(default=30.0, gt=0, description="Seconds to wait for a free connection.")
    connect_timeout_s: int = Field(default=10, ge=1, description="Seconds to wait for a new connection.")
    statement_timeout_ms: int = Field(
        default=30_000, ge=0, description="Server-side limit per statement (0 = none)."
    )
    durable_recall_audit: bool = Field(
        default=False,
        description=(
            "Wait for each recall-audit row to reach disk before a search returns. Off: the "
            "row commits asynchronously (a crash can lose the last fraction of a second of "
            "recall-audit rows, never memories), which saves a disk flush per recall."
        ),
    )
    max_text_chars: int = Field(
        default=32_000, ge=1, description="Longest memory text accepted, in characters."
    )

    embedder: Literal["use", "minilm", "openai"] = Field(
        default="use", description="Which embedder make_embedder() builds."
    )
    embedder_threads: int = Field(default=1, ge=1, description="CPU threads of a local embedder.")

    openai_base_url: str | None = Field(
        default=None, description="Base URL of an OpenAI-compatible API (unset = api.openai.com)."
    )
    openai_api_key: SecretStr | None = Field(default=None, description="API key for that endpoint.")
    openai_chat_model: str = Field(default="gpt-4o-mini", description="Chat-completions model.")
    openai_embedding_model: str = Field(
        default="text-embedding-3-small", description="Embeddings model."
    )
    openai_embedding_dimensions: int | None = Field(
        default=None, ge=1, description="Requested embedding size (models that support it)."
    )
    openai_timeout_s: float = Field(default=60.0, gt=0, description="Per-request timeout.")
    openai_max_retries: int = Field(
        default=4, ge=0, description="Retries with exponential backoff on transient API errors."
    )
