"""Configuration, read from the environment (prefix ``PGMEMORY_``) and, only when asked for,
from a ``.env``-style file.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

import platformdirs
from pydantic import Field, SecretStr
from pydantic_settings import (
    BaseSettings,
    DotEnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from pgmemory.errors import InvalidInputError

#: The environment variable that names a settings file to read (unset: none is read).
ENV_FILE_VARIABLE = "PGMEMORY_ENV_FILE"


def _default_data_dir() -> Path:
    """The embedded server's default data directory (per user, e.g. ``~/.local/share``)."""
    return platformdirs.user_data_path("pgmemory") / "pgdata"


def _existing_file(path: str | os.PathLike[str], named_by: str) -> Path:
    """``path`` as a :class:`Path`, if it is a file.

    Args:
        path: the settings file asked for.
        named_by: who asked, for the error message.

    Returns:
        The path, with ``~`` expanded.

    Raises:
        InvalidInputError: there is no file at ``path``.
    """
    file = Path(path).expanduser()
    if not file.is_file():
        raise InvalidInputError(
            f"{named_by} names the settings file {str(file)!r}, which does not exist"
        )
    return file


class Settings(BaseSettings):
    """Every knob pgmemory reads; each field is also ``PGMEMORY_<FIELD>`` in the environment.

    Leave ``database_url`` unset to run on the embedded PostgreSQL server under ``data_dir``.
    Secrets are :class:`~pydantic.SecretStr` and never appear in logs or reprs.

    No ``.env`` file is read unless asked for, so what a process runs with does not depend on
    the directory it was started in. To read one:

    - ``Settings.from_env_file(path)`` (or pydantic-settings' ``Settings(_env_file=path)``);
    - or set ``PGMEMORY_ENV_FILE=path``: every ``Settings()`` then reads that file, including
      those the library makes itself (``MemoryStore()``, ``make_embedder()``, the CLI).

    Variables set in the environment win over the file's. Keyword arguments win over both.
    """

    model_config = SettingsConfigDict(
        env_prefix="PGMEMORY_", env_file=None, env_file_encoding="utf-8", extra="ignore"
    )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Read the file ``PGMEMORY_ENV_FILE`` names when no file was passed as ``_env_file``.

        Args:
            settings_cls: the settings class being built.
            init_settings: values passed as keyword arguments.
            env_settings: values from environment variables.
            dotenv_settings: values from the ``_env_file`` argument (none by default).
            file_secret_settings: values from a secrets directory.

        Returns:
            The sources, highest priority first: arguments, environment, file, secrets.

        Raises:
            InvalidInputError: ``PGMEMORY_ENV_FILE`` names a file that does not exist.
        """
        named = os.environ.get(ENV_FILE_VARIABLE)
        if (
            named
            and isinstance(dotenv_settings, DotEnvSettingsSource)
            and dotenv_settings.env_file is None
        ):
            dotenv_settings = DotEnvSettingsSource(
                settings_cls, env_file=_existing_file(named, ENV_FILE_VARIABLE)
            )
        return init_settings, env_settings, dotenv_settings, file_secret_settings

    @classmethod
    def from_env_file(cls, path: str | os.PathLike[str], **values: Any) -> Settings:
        """Settings from the environment and the ``.env``-style file at ``path``.

        Args:
            path: a file of ``PGMEMORY_<FIELD>=value`` lines.
            **values: fields to set explicitly; they win over the environment and the file.

        Returns:
            The settings.

        Raises:
            InvalidInputError: there is no file at ``path``.
        """
        return cls(_env_file=_existing_file(path, "Settings.from_env_file"), **values)

    database_url: SecretStr | None = Field(
        default=None,
        description="SQLAlchemy/libpq URL of a PostgreSQL server with pgvector; unset = embedded server.",
    )
    read_urls: SecretStr | None = Field(
        default=None,
        description=(
            "Comma-separated URLs of hot standbys of database_url that serve reads (search, "
            "list, count, history); writes and recall audit rows always go to the primary. "
            "Unset: every read goes to the primary."
        ),
    )
    replica_wait_ms: float = Field(
        default=50.0,
        ge=0,
        description=(
            "Longest a read waits for a replica to replay the reading user's own latest "
            "write before it is served by the primary instead."
        ),
    )
    replica_max_lag_s: float = Field(
        default=5.0, gt=0, description="A replica further behind than this is skipped."
    )
    replica_retry_s: float = Field(
        default=5.0, gt=0, description="How long an unreachable replica is skipped for."
    )
    replica_check_interval_s: float = Field(
        default=1.0, ge=0, description="How often each replica's lag is checked."
    )
    embedded: bool = Field(
        default=True,
        description=(
            "With no database_url, start (or reuse) the embedded server; false makes a missing "
            "URL an error. Set it to false in production, where a misspelled URL must not send "
            "users' memories to a local data directory."
        ),
    )
    data_dir: Path = Field(
        default_factory=_default_data_dir, description="Data directory of the embedded server."
    )
    pool_size: int = Field(default=5, ge=1, description="Connections kept open in the pool.")
    max_overflow: int = Field(
        default=5, ge=0, description="Extra connections allowed above pool_size."
    )
    pool_timeout_s: float = Field(
        default=30.0, gt=0, description="Seconds to wait for a free connection."
    )
    connect_timeout_s: int = Field(
        default=10, ge=1, description="Seconds to wait for a new connection."
    )
    statement_timeout_ms: int = Field(
        default=30_000, ge=0, description="Server-side limit per statement (0 = none)."
    )
    prepared_statements: bool = Field(
        default=True,
        description=(
            "Prepare statements on each server connection (a repeated statement skips parsing "
            "and planning). Set false behind a pooler in transaction mode (PgBouncer before "
            "1.21, or without max_prepared_statements), where the next statement may run on a "
            "server connection that never saw the prepare."
        ),
    )
    durable_recall_audit: bool = Field(
        default=False,
        description=(
            "Wait for each recall-audit row to reach disk before a search returns. Off: the "
            "row commits asynchronously (a crash can lose the last fraction of a second of "
            "recall-audit rows, never memories), which saves a disk flush per recall."
        ),
    )
    telemetry_sensitive_data: bool = Field(
        default=False,
        description=(
            "Put query and memory texts in the OpenTelemetry spans (gen_ai.memory.query.text, "
            "gen_ai.memory.records). Off: spans carry counts, scores, ids and modes only."
        ),
    )
    telemetry_user_key: SecretStr | None = Field(
        default=None,
        description=(
            "A key of the application's: spans then carry pgmemory.user.pseudonym, an "
            "HMAC-SHA256 of the user id under it. Unset: no user appears in spans."
        ),
    )
    max_text_chars: int = Field(
        default=32_000, ge=1, description="Longest memory text accepted, in characters."
    )

    ui_token: SecretStr | None = Field(
        default=None,
        description=(
            "Retired: the audit page's tokens are kept hashed in the database (`pgmemory "
            "token create NAME`); `pgmemory ui` refuses to start while this is set."
        ),
    )
    ui_allowed_hosts: str | None = Field(
        default=None,
        description=(
            "Comma-separated Host names the audit page answers to besides 127.0.0.1, "
            "localhost, [::1] and the bound address (a reverse proxy's: `name` or `name:port`)."
        ),
    )

    embedder: Literal["use", "minilm", "openai"] = Field(
        default="use", description="Which embedder make_embedder() builds."
    )
    embedder_threads: int = Field(default=1, ge=1, description="CPU threads of a local embedder.")
    embed_batching: bool = Field(
        default=True,
        description=(
            "Embed the texts of concurrent calls together, in one model call on one worker "
            "thread (local embedders only)."
        ),
    )
    embed_batch_max: int = Field(default=32, ge=1, description="Most texts per batched model call.")
    embed_batch_wait_ms: float = Field(
        default=2.0,
        ge=0,
        description=(
            "Longest a call waits for others to batch with, only under concurrent load "
            "(a lone caller never waits)."
        ),
    )

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
    openai_embedding_base_url: str | None = Field(
        default=None,
        description="Base URL for embeddings when it differs from the chat one (unset = the chat one).",
    )
    openai_embedding_api_key: SecretStr | None = Field(
        default=None, description="API key for the embeddings endpoint (unset = the chat one)."
    )
    openai_embedding_model_id: str | None = Field(
        default=None,
        description="Id recorded with every vector (unset = 'openai:<model>@<dimensions>').",
    )
    openai_timeout_s: float = Field(default=60.0, gt=0, description="Per-request timeout.")
    openai_max_retries: int = Field(
        default=4, ge=0, description="Retries with exponential backoff on transient API errors."
    )

    def ui_allowed_host_list(self) -> list[str]:
        """The audit page's extra Host names (``ui_allowed_hosts`` split at commas)."""
        return [h.strip() for h in (self.ui_allowed_hosts or "").split(",") if h.strip()]

    def read_url_list(self) -> list[str]:
        """The read replicas' URLs (``read_urls`` split at commas; empty when unset)."""
        if self.read_urls is None:
            return []
        return [url.strip() for url in self.read_urls.get_secret_value().split(",") if url.strip()]
