"""Start-up messages of third-party libraries that a genalign user cannot act on, filtered out.

With torchao installed (the ``quantization`` extra, for Sol-RL's fp8 / NVFP4 previews), importing
diffusers or transformers imports torchao, which prints two kinds of notice on every start:

* torch's pytree registry warns that torchao registers Enum classes it no longer needs to
  (``... is an Enum subclass and is now natively supported by torch.compile ...``);
* diffusers' torchao quantizer warns ``Unable to import `torchao` Tensor objects`` when the
  installed torchao moved the classes it looks for; that only matters for loading checkpoints
  serialised with torchao tensors, which genalign never does.

Neither is about the user's run. Only these exact messages are dropped; every other warning of
those loggers still shows.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Sequence

__all__ = ["STARTUP_NOISE", "quiet_messages", "silence_startup_noise"]

# logger name -> message fragments dropped from it
STARTUP_NOISE: dict[str, tuple[str, ...]] = {
    "torch.utils._pytree": ("is an Enum subclass and is now natively supported by torch.compile",),
    "diffusers.quantizers.torchao.torchao_quantizer": ("Unable to import `torchao` Tensor objects",),
}


class _DropMessages(logging.Filter):
    """Drops a record whose message holds any of ``fragments`` (every one of them: ``every``)."""

    def __init__(self, fragments: tuple[str, ...], every: bool = False) -> None:
        super().__init__()
        self.fragments, self.every = fragments, every

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        found = (fragment in message for fragment in self.fragments)
        return not (all(found) if self.every else any(found))


def silence_startup_noise() -> None:
    """Attach the filters (idempotent); call before diffusers or transformers is imported."""
    for name, fragments in STARTUP_NOISE.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropMessages) for f in logger.filters):
            logger.addFilter(_DropMessages(fragments))


@contextlib.contextmanager
def quiet_messages(logger_names: Sequence[str], *fragments: str) -> Iterator[None]:
    """While the block runs, drop the records of ``logger_names`` whose message holds every one of
    ``fragments`` (a third-party notice a user cannot act on, only where genalign knows it is moot)."""
    loggers, quiet = [logging.getLogger(name) for name in logger_names], _DropMessages(fragments, every=True)
    for logger in loggers:
        logger.addFilter(quiet)
    try:
        yield
    finally:
        for logger in loggers:
            logger.removeFilter(quiet)
