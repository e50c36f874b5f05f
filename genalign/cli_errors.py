"""The one-line message ``genalign`` prints for an error (:func:`describe_error`)."""

from __future__ import annotations

__all__ = ["describe_error"]


def describe_error(error: BaseException) -> str:
    """One line for a user: the message of an error we raise on purpose (it names the file, key
    or line), the type as well for anything else, and how to see the traceback."""
    import yaml

    from genalign.trainers.checkpoint import CorruptCheckpointError, RecipeMismatchError
    from genalign.trainers.guards import NonFiniteWeightsError
    from genalign.trainers.run_folder import RunFolderError

    message = error.args[0] if isinstance(error, KeyError) and error.args else str(error)
    if isinstance(error, OSError) and error.filename and str(error.filename) not in message:
        message = f"{error.filename}: {message}"
    expected = (
        ValueError,  # ConfigError, CorruptCheckpointError, RecipeMismatchError and bad input
        LookupError,  # unknown registry names
        OSError,  # missing files, a full disk (ENOSPC)
        ImportError,  # a plug-in that cannot be imported
        yaml.YAMLError,
        RunFolderError,
        NonFiniteWeightsError,
        CorruptCheckpointError,
        RecipeMismatchError,
    )
    if isinstance(error, expected):
        return " ".join(message.split("\n")[:1]) or type(error).__name__
    first = message.splitlines()[0] if message else ""
    return f"{type(error).__name__}: {first} (run with --debug for the traceback)"
