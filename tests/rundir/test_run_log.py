"""``RunLog`` after a kill: the resumed run's metrics.jsonl and TensorBoard scalars are the
uninterrupted run's (no step twice), as TensorBoard reads the event files."""

import json
import os
import struct

from tensorboardX.proto.event_pb2 import Event, SessionLog

from cvs_jax.rundir import paths
from cvs_jax.rundir.run_log import RunLog


def _events(path: str):
    with open(path, "rb") as f:
        data = f.read()
    at = 0
    while at < len(data):
        (n,) = struct.unpack("<Q", data[at : at + 8])
        yield Event.FromString(data[at + 12 : at + 12 + n])
        at += 12 + n + 4


def tensorboard_scalars(workdir: str, tag: str) -> list[tuple[int, float]]:
    """``(step, value)`` of ``tag`` as TensorBoard shows it: event files in name order, a session START
    at step N hiding every earlier event at step >= N (its purge rule)."""
    directory = os.path.join(workdir, paths.TENSORBOARD)
    files = sorted(os.listdir(directory))
    seen: list[tuple[int, float]] = []
    for name in files:
        for e in _events(os.path.join(directory, name)):
            if e.HasField("session_log") and e.session_log.status == SessionLog.START:
                seen = [(s, v) for s, v in seen if s < e.step]
            for value in e.summary.value:
                if value.tag == tag:
                    seen.append((e.step, value.simple_value))
    return seen


def test_a_resumed_log_writes_each_step_once(tmp_path):
    wd = str(tmp_path)
    log = RunLog(wd)
    for step in (1, 2, 3, 4):  # the killed run got to step 4; its checkpoint is at step 2
        log.write(global_step=step, session=1, epoch=1, step=step, loss=float(step))
    log.close()
    log = RunLog(wd)
    log.truncate(session=1, step=2, global_step=2)
    for step in (3, 4):
        log.write(global_step=step, session=1, epoch=1, step=step, loss=10.0 + step)
    log.close()
    with open(paths.metrics_file(wd)) as f:
        assert [(r["step"], r["loss"]) for r in map(json.loads, f)] == [(1, 1.0), (2, 2.0), (3, 13.0), (4, 14.0)]
    assert tensorboard_scalars(wd, "loss") == [(1, 1.0), (2, 2.0), (3, 13.0), (4, 14.0)]
