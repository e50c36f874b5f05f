"""Rewards that misbehave on cue, for the fault-injection tests (loaded as ``faulty_rewards:...``)."""

from __future__ import annotations

import os
import signal
from typing import Any

from genalign.rewards.jpeg import JPEGCompressibilityReward


class FaultAtCall(JPEGCompressibilityReward):
    """JPEG compressibility, except on call number ``at`` (0-based), where it does ``fault``.

    The fault comes from the environment (``GENALIGN_TEST_FAULT="<at>:<fault>"``), not from the
    recipe, so the faulty run and its resumed continuation share one recipe fingerprint. Faults:

    ``raise`` (a RuntimeError), ``sigterm`` / ``sigint`` (signals itself mid-step, then scores),
    ``sigint2`` (two Ctrl-C in a row), ``inf`` / ``nan`` (sample 0 scores -inf / NaN).
    """

    name = "fault_at_call"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        at, _, fault = os.environ.get("GENALIGN_TEST_FAULT", "-1:none").partition(":")
        self.at, self.fault, self.calls = int(at), fault, 0

    def score(self, images, prompts, **metadata):
        call, self.calls = self.calls, self.calls + 1
        out = super().score(images, prompts, **metadata)
        if call != self.at:
            return out
        if self.fault == "raise":
            raise RuntimeError("reward server went away")
        if self.fault in ("sigterm", "sigint"):
            os.kill(os.getpid(), signal.SIGTERM if self.fault == "sigterm" else signal.SIGINT)
        elif self.fault == "sigint2":
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGINT)
        elif self.fault in ("inf", "nan"):
            out.scores[0] = float("-inf") if self.fault == "inf" else float("nan")
        return out
