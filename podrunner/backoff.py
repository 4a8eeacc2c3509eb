"""kubelet's restart backoff for a container whose pod restarts it (restartPolicy Always or OnFailure).

kubelet keys a backoff per container: the first crash restarts at once, and each further restart waits until
`delay` has passed since the previous restart, the delay doubling from 10 s up to 5 min. A container that
stayed up longer than twice the cap starts over at 10 s. Pure: the caller passes the clock.
"""

from __future__ import annotations

import dataclasses

INITIAL_S = 10.0
CAP_S = 300.0


@dataclasses.dataclass
class RestartBackoff:
    initial_s: float = INITIAL_S
    cap_s: float = CAP_S
    last_restart: float | None = None
    delay_s: float = 0.0

    def wait_s(self, now: float) -> float:
        """Seconds to wait before the next restart, for a container that has just exited at `now`."""
        if self.last_restart is None or self._expired(now):
            return 0.0
        return max(0.0, self.last_restart + self.delay_s - now)

    def restarted(self, now: float) -> None:
        """Records a restart at `now` and grows the delay the next crash will wait."""
        if self.last_restart is None or self._expired(now):
            self.delay_s = self.initial_s
        else:
            self.delay_s = min(self.delay_s * 2, self.cap_s)
        self.last_restart = now

    def _expired(self, now: float) -> bool:
        # As kubelet's flowcontrol.Backoff: an entry older than twice the cap is forgotten.
        return self.last_restart is not None and now - self.last_restart > 2 * self.cap_s
