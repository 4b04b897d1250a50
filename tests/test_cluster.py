"""The cluster executor's parts that need no scheduler (the real SLURM: tests/test_slurm.py, slow):
squeue's states read as submitit's, the stop shared by sweeps and the launch panel, the interrupt
line naming what was cancelled, finished points never submitted."""

from __future__ import annotations

import signal
from concurrent.futures import Future

from zfree.core.errors import Interrupted
from zfree_lab.cli import _interrupt_line
from zfree_lab.experiment.cluster import ENDED_UNLISTED, SqueueWatcher, _id_list
from zfree_lab.experiment.executor import run_points, stop_workers
from zfree_lab.experiment.spec import expand_grid
from tests.tiny import tiny_flat


def test_squeue_states_read_as_submitits():
    w = SqueueWatcher(delay_s=60)
    for j in ("11", "12", "13", "14"):
        w.register_job(j)
    info = w.read_info("11|CONFIGURING|\n12|RUNNING|vm\n13|CANCELLED|vm\n99|RUNNING|other\n")
    assert {j: i["State"] for j, i in info.items()} == {"11": "PENDING", "12": "RUNNING", "13": "CANCELLED",
                                                        "14": ENDED_UNLISTED}  # 99: not this process's
    w._info_dict.update(info)
    assert [w.is_done(j, mode="cache") for j in ("11", "12", "13", "14")] == [False, False, True, True]
    assert w._make_command()[:2] == ["squeue", "--me"]


class StoppableExecutor:
    """An executor with a stop of its own (as cluster.SubmititExecutor): jobs stay pending."""

    def __init__(self):
        self.submitted, self.stopped = [], False

    def submit(self, fn, *args):
        self.submitted.append(args[0].run_id)
        return Future()

    def stop(self):
        self.stopped = True
        return "cancelled 2 SLURM job(s) queued or running (scancel 5 6)"

    def shutdown(self, wait=True):
        pass


def test_stop_workers_uses_the_executors_own_stop_and_cancels_the_futures():
    ex, futs = StoppableExecutor(), [Future(), Future()]
    assert stop_workers(ex, futs) == "cancelled 2 SLURM job(s) queued or running (scancel 5 6)"
    assert ex.stopped and all(f.cancelled() for f in futs)


def test_interrupt_line_names_what_the_stop_cancelled():
    e = Interrupted(signal.SIGTERM)
    e.stopped = "cancelled 2 SLURM job(s) queued or running (scancel 5 6)"
    line, code = _interrupt_line(e, "sweep")
    assert code == 143 and line.startswith("zfree: interrupted; cancelled 2 SLURM job(s) queued or running "
                                           "(scancel 5 6); rerun the same command") and line.endswith("(SIGTERM)")
    assert _id_list([str(i) for i in range(10)], show=3) == "scancel 0 1 2 ... (+7 more)"


def test_finished_points_are_not_submitted(tmp_path):
    points = expand_grid(tiny_flat("d", "b"), {"beta": [0.1, 0.2]})
    done = tmp_path / "runs" / points[0].run_id
    done.mkdir(parents=True)
    (done / "summary.json").write_text("{}")
    seen = []
    ex = StoppableExecutor()

    def instant(futs):  # every submitted future completes at once
        for f in futs:
            f.set_result({"run_id": points[1].run_id, "status": "finished"})

    statuses = run_points(points, tmp_path / "runs", executor=ex, progress=False, on_done=seen.append,
                          on_submit=instant)
    assert ex.submitted == [points[1].run_id]
    assert [s["status"] for s in statuses] == ["skipped", "finished"] and len(seen) == 2
