"""Errors a user can act on. Stages catch these, print the message and exit non-zero."""


class PipelineError(Exception):
    """Base class: the message must say what was wrong and what was expected."""


class ConfigError(PipelineError):
    """A parameter is unknown, of the wrong type or impossible; the message names the key."""


class DatasetError(PipelineError):
    """An input dataset is unreadable or invalid; the message names file, row and field."""


class ShardError(PipelineError):
    """Embedding shards are missing or do not match their manifest; the message names the file."""
