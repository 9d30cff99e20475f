"""Errors a user can act on. Stages catch these, print the message and exit non-zero."""


class PipelineError(Exception):
    """Base class: the message must say what was wrong and what was expected."""


class ConfigError(PipelineError):
    """A parameter is unknown, of the wrong type or impossible; the message names the key."""


class DatasetError(PipelineError):
    """An input dataset is unreadable or invalid; the message names file, row and field."""


class ShardError(PipelineError):
    """Embedding shards are missing or do not match their manifest; the message names the file."""


class DiskFull(PipelineError):
    """A write failed for lack of space or quota; the message names the file and what was kept
    (pipeline/core/atomic.py recognises the ways a full disk shows)."""

    def __init__(self, message: str, path, errno_: int):
        super().__init__(message)
        self.path, self.errno = path, errno_


class TrackingUnavailable(PipelineError):
    """The MLflow tracking server does not answer; the message names its URI and what to do."""


class Terminated(KeyboardInterrupt):
    """SIGTERM (a scheduler, `kill`, `dvc queue kill`), raised in the main thread so that every
    `with` block unwinds as for Ctrl-C: metrics are flushed and the MLflow run ends KILLED. It is a
    KeyboardInterrupt so that code which already handles Ctrl-C handles this too."""

    def __init__(self, signum: int):
        super().__init__(f"terminated by signal {signum}")
        self.signum = signum


class ResourceError(PipelineError):
    """A config whose estimated memory or checkpoint size cannot fit the machine, refused before
    anything is built (pipeline/train/memory_estimate.py); the message names the estimate's parts, what
    is available and the keys to change."""
