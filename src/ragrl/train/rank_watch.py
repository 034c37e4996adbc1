"""A rank that dies or stalls: the other ranks stop within a bound, naming it and its step.

Without this, a rank whose peer died waits in its next collective for the process group's timeout
(30 minutes by default), and one whose peer is frozen waits the same; the field's reports (verl
#2445 and others) are mostly of runs hung like that. Two bounds, both in the recipe's `guard`:

* A heartbeat. Every rank runs a thread that writes a beat (a counter, plus the step and phase the
  trainer is in) to the process group's store every `rank_silence_s / 10` seconds, and reads the
  others'. A rank whose beat has not moved for `guard.rank_silence_s` is dead or frozen (killed,
  SIGSTOPped, swapped out): the watching rank logs which rank and where it was last, and exits with
  code 69 at once, even from inside a collective that would otherwise block until its timeout.
  A store that stops answering means the process holding it is gone (rank 0's, or the launcher's).
* A collective timeout, `guard.collective_timeout_s`, given to the process group. It bounds a rank
  whose thread still beats but whose main thread never reaches the collective (a hung rollout).
  When a collective fails (the peer's socket closed, or the timeout), `explain` turns the backend's
  error into `RankLost`, naming the rank whose beat stopped, or else the ranks behind this one.

The thread only reads the trainer's `where` (a step and a phase name) and the store; it never
touches the model. Checkpoints are atomic and metrics rows are fsynced, so an exit from the thread
loses nothing that `--resume` does not redo.
"""
from __future__ import annotations

import json
import logging
import os
import re
import sys
import threading
import time

import torch.distributed as dist

from ragrl.errors import RankLost

log = logging.getLogger("ragrl.train")

PHASES = ("start", "rollout", "reward", "update", "evaluation", "checkpoint")   # a step's order


# gloo raises a plain RuntimeError ("[.../gloo/transport/tcp/pair.cc:553] Connection closed by peer",
# "Timed out waiting 3000ms for recv operation"); NCCL and newer torch a DistError.
_BACKEND_ERROR = re.compile(r"gloo|nccl|Connection (closed|reset) by peer|Timed out waiting|ProcessGroup", re.I)


def exit_without_teardown(code: int) -> None:
    """Flush the logs and streams, then exit at once, skipping the interpreter's teardown: after a
    lost rank the process group holds a timed-out collective (or a main thread blocked in one), and
    destroying it at exit can abort the process (SIGABRT), so the launcher would see a crash instead
    of the rank's own exit code."""
    for handler in logging.getLogger("ragrl").handlers:
        handler.flush()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def is_collective_failure(error: BaseException) -> bool:
    """Whether `error` is a collective's (the backend's), not this rank's own bug."""
    return isinstance(error, getattr(dist, "DistError", ())) or (
        isinstance(error, RuntimeError) and bool(_BACKEND_ERROR.search(str(error))))


def beat_interval(silence_s: float) -> float:
    """Seconds between beats: ten to a silence bound, between 0.1 and 5."""
    return min(5.0, max(0.1, silence_s / 10))


class RankWatch:
    """This rank's heartbeat, and its view of the others' (see the module doc).

    `store`: a c10d store every rank shares (default: the process group's own). `exit_on_lost`:
    exit the process (code 69) when the thread finds a rank lost and the main thread is not
    already explaining a failed collective; off in tests that watch the verdict."""

    def __init__(self, rank: int, world: int, silence_s: float, store=None, exit_on_lost: bool = True):
        self.rank, self.world, self.silence_s = rank, world, silence_s
        self.beat_s = beat_interval(silence_s)
        base = store if store is not None else dist.distributed_c10d._get_default_store()
        self.store = dist.PrefixStore("ragrl/beat/", base)
        self.exit_on_lost = exit_on_lost
        self.where = {"step": 0, "phase": "start"}
        self.seq = 0
        start = time.monotonic()   # a peer that never beat counts as silent from here
        self.peers = {p: {"seq": None, "changed": start, "beat": None} for p in range(world) if p != rank}
        self.verdict: str | None = None
        self.explaining = False
        self._stop = threading.Event()
        self._beat()
        self.thread = threading.Thread(target=self._run, name=f"ragrl-rank-watch-{rank}", daemon=True)
        self.thread.start()

    def at(self, step: int, phase: str) -> None:
        """The trainer's position, sent with the next beat (cheap: two dict writes)."""
        self.where = {"step": step, "phase": phase}

    def stop(self, error: BaseException | None = None) -> None:
        """Stop beating, with a last beat that says why: done (the others stop watching this rank,
        which may now wait in a final barrier), or the error this rank stopped on (the others name it
        at once instead of waiting for silence)."""
        self._stop.set()
        self.thread.join(timeout=2 * self.beat_s + 1)
        end = {"end": "done"} if error is None else {
            "end": "failed", "error": f"{type(error).__name__}: {(str(error).splitlines() or [''])[0][:300]}"}
        try:
            self.seq += 1
            self.store.set(str(self.rank), json.dumps({"seq": self.seq, **self.where, **end}))
        except Exception:   # noqa: BLE001 - the store's holder is gone already: nobody is left to tell
            pass

    # ------------------------------------------------------------ the thread
    def _beat(self) -> None:
        self.seq += 1
        self.store.set(str(self.rank), json.dumps({"seq": self.seq, **self.where}))

    def look(self, silence_s: float | None = None) -> str | None:
        """One look at the others' beats: a sentence naming the first rank silent for `silence_s`
        (default the bound), else None."""
        silence_s = self.silence_s if silence_s is None else silence_s
        now = time.monotonic()
        for peer, seen in self.peers.items():
            if self.store.check([str(peer)]):
                beat = json.loads(self.store.get(str(peer)))
                if beat.get("end") == "failed":
                    return f"rank {peer} stopped on an error at step {beat['step']} ({beat['phase']}): {beat['error']}"
                if beat.get("end") == "done":
                    continue   # finished its loop; it waits for the others in the final barrier
                if beat["seq"] != seen["seq"]:
                    seen.update(seq=beat["seq"], changed=now, beat=beat)
                    continue
            if now - seen["changed"] > silence_s:
                last = (f"its last beat: step {seen['beat']['step']}, {seen['beat']['phase']}"
                        if seen["beat"] else "it never beat")
                return (f"rank {peer} stopped responding: no heartbeat for {now - seen['changed']:.0f} s "
                        f"(guard.rank_silence_s={self.silence_s:g}; {last}); it was killed, or is frozen")
        return None

    def _run(self) -> None:
        while not self._stop.wait(self.beat_s):
            try:
                self._beat()
                verdict = self.look()
            except Exception as e:   # noqa: BLE001 - any store failure means its holder is gone
                verdict = (f"the process group's store stopped answering ({type(e).__name__}: "
                           f"{(str(e).splitlines() or [''])[0]}): the process holding it (rank 0, or the "
                           "launcher's agent) is gone")
            if verdict is not None:
                self.verdict = verdict
                if self.exit_on_lost and not self.explaining:
                    self._exit(verdict)
                return

    def _exit(self, verdict: str) -> None:
        """Leave now: the main thread may be blocked in a collective that would wait for its timeout."""
        message = (f"rank {self.rank} stops at step {self.where['step']} ({self.where['phase']}): {verdict}. "
                   "Checkpoints and metrics rows written so far are intact; start every rank again with "
                   "--resume")
        log.error(message)
        sys.stderr.write(f"error: {message}\n")
        exit_without_teardown(RankLost.exit_code)

    # ------------------------------------------------------------ a failed collective
    def explain(self, error: BaseException) -> RankLost:
        """The RankLost to raise for a collective that failed with `error`: it names the rank whose
        beat stopped (waiting up to three beats for a killed one's to go quiet), else the ranks that
        are behind this one (a main thread hung while its beat goes on), else all of them."""
        self.explaining = True
        deadline = time.monotonic() + 3 * self.beat_s + 1
        verdict = self.verdict
        while verdict is None and time.monotonic() < deadline:
            time.sleep(self.beat_s / 2)
            try:
                verdict = self.verdict or self.look(silence_s=2 * self.beat_s)
            except Exception as e:   # noqa: BLE001
                verdict = f"the process group's store stopped answering ({type(e).__name__})"
        if verdict is None:
            verdict = self._behind()
        first = (str(error).splitlines() or [""])[0][:300]
        message = (f"rank {self.rank} stopped at step {self.where['step']} ({self.where['phase']}): {verdict}. "
                   f"The collective's error: {type(error).__name__}: {first}. Checkpoints and metrics rows "
                   "written so far are intact; start every rank again with --resume")
        log.error(message)   # into this rank's train log too, beside the console's one line
        return RankLost(message)

    def _behind(self) -> str:
        mine = (self.where["step"], PHASES.index(self.where["phase"]))
        late = [(p, s["beat"]) for p, s in self.peers.items() if s["beat"] is not None
                and (s["beat"]["step"], PHASES.index(s["beat"]["phase"])) < mine]
        if late:
            return "; ".join(f"rank {p} is alive but did not reach the collective (it is at step {b['step']}, "
                             f"{b['phase']})" for p, b in late)
        seen = ", ".join(f"rank {p} at step {s['beat']['step']}, {s['beat']['phase']}" if s["beat"]
                         else f"rank {p} never beat" for p, s in self.peers.items())
        return f"no rank's heartbeat stopped ({seen})"
