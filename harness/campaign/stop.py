"""Stopping campaigns from outside: SIGTERM (what `timeout` and CI runners send) and SIGINT end a campaign
after its case in flight, with its report; a parallel campaign forwards the signal to its shards. A campaign
killed outright (SIGKILL, a second signal, the OOM killer) keeps its last checkpoint (:class:`Checkpoint`)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hicache_fuzz.harness.campaign.loop import CampaignReport


class StopOnSignal:
    """SIGTERM (what `timeout` and CI runners send) and SIGINT end the campaign after the case in flight,
    and the final report is written as usual. A second signal falls back to the default behaviour."""

    def __init__(self) -> None:
        self.signal_name = ""
        self._previous: dict[int, Any] = {}
        for number in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(ValueError):  # not the main thread: no handler, budgets still apply
                self._previous[number] = signal.signal(number, self._handle)

    def _handle(self, number: int, frame: object) -> None:
        self.signal_name = signal.Signals(number).name
        self.restore()

    def requested(self) -> bool:
        return bool(self.signal_name)

    def restore(self) -> None:
        for number, previous in self._previous.items():
            signal.signal(number, previous)
        self._previous.clear()


class ForwardSignals:
    """SIGTERM/SIGINT to the parent of a parallel campaign: each running child gets SIGTERM (it ends after its
    case in flight and writes its report), the parent keeps waiting and merges what they wrote. A second
    signal kills the children's process groups at once and raises KeyboardInterrupt."""

    def __init__(self) -> None:
        self.signal_name = ""
        self.children: list[subprocess.Popen[bytes]] = []
        self._previous: dict[int, Any] = {}
        for number in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(ValueError):  # not the main thread: no forwarding
                self._previous[number] = signal.signal(number, self._handle)

    def add(self, process: subprocess.Popen[bytes]) -> None:
        self.children.append(process)
        if self.signal_name:  # the signal came while it was starting
            self._terminate(process)

    def _handle(self, number: int, frame: object) -> None:
        if self.signal_name:
            for process in self.children:
                if process.poll() is None:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(process.pid, signal.SIGKILL)
            raise KeyboardInterrupt
        self.signal_name = signal.Signals(number).name
        for process in self.children:
            self._terminate(process)

    @staticmethod
    def _terminate(process: subprocess.Popen[bytes]) -> None:
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)

    def restore(self) -> None:
        for number, previous in self._previous.items():
            signal.signal(number, previous)
        self._previous.clear()


class Checkpoint:
    """Writes the campaign report (``"partial": true``) every `every` seconds and after each failure, so a
    campaign killed from outside (a CI time limit, the OOM killer) still leaves its counts on disk. The
    failures themselves are on disk already (saved as they are found)."""

    def __init__(self, path: str | None, every: float = 10.0) -> None:
        self.path = Path(path) if path else None
        self.every = every
        self.last = time.monotonic()

    def __call__(self, report: CampaignReport, force: bool = False) -> None:
        """Write the checkpoint if `every` seconds passed since the last one (at once with `force`)."""
        now = time.monotonic()
        if self.path is None or (not force and now - self.last < self.every):
            return
        self.last = now
        from hicache_fuzz.harness.model.output_paths import write_json_atomic

        try:
            write_json_atomic(self.path, {**report.to_dict(), "partial": True})
        except OSError as exc:  # the final report has its own fallback; a checkpoint is not worth a campaign
            print(f"hicache-fuzz: cannot write the checkpoint {self.path} ({exc.strerror or exc}); checkpoints "
                  "stop, the final report will still be written", file=sys.stderr, flush=True)
            self.path = None
