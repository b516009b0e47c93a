"""The rule that decides when a Faust table recovery has stalled and is restarted (`recovery_watch`)."""

from __future__ import annotations

from dpstream.workers.runtime.recovery_watch import RecoveryProgress

STALL = 15.0


def _looks(progress: RecoveryProgress, times: list[float], **state) -> list[bool]:
    return [progress.stalled(t, **state) for t in times]


def test_a_recovery_that_does_not_move_is_restarted_after_stall_s_and_again_after_another() -> None:
    progress = RecoveryProgress(STALL)
    state = {"in_recovery": True, "remaining": 5, "offsets": {"tp1": 10}}
    assert _looks(progress, [0.0, 1.0, 14.9], **state) == [False, False, False]
    assert progress.stalled(15.0, **state)
    assert not progress.stalled(29.9, **state)  # the restarted recovery gets its own stall_s
    assert progress.stalled(30.0, **state)


def test_a_moving_recovery_is_never_restarted() -> None:
    progress = RecoveryProgress(STALL)
    for t in range(0, 200, 10):
        assert not progress.stalled(float(t), in_recovery=True, remaining=1000 - t, offsets={"tp1": t})


def test_nothing_left_to_read_or_no_recovery_is_not_a_stall() -> None:
    done = RecoveryProgress(STALL)
    assert not any(_looks(done, [0.0, 20.0, 40.0], in_recovery=True, remaining=0, offsets={"tp1": 3}))
    idle = RecoveryProgress(STALL)
    assert not any(_looks(idle, [0.0, 20.0, 40.0], in_recovery=False, remaining=5, offsets={"tp1": 3}))


def test_the_clock_restarts_when_a_new_recovery_begins() -> None:
    progress = RecoveryProgress(STALL)
    assert not progress.stalled(0.0, in_recovery=True, remaining=5, offsets={"tp1": 3})
    assert not progress.stalled(10.0, in_recovery=False, remaining=0, offsets={"tp1": 8})
    assert not progress.stalled(11.0, in_recovery=True, remaining=5, offsets={"tp1": 8})
    assert not progress.stalled(25.9, in_recovery=True, remaining=5, offsets={"tp1": 8})
    assert progress.stalled(26.0, in_recovery=True, remaining=5, offsets={"tp1": 8})
