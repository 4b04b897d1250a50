"""Keep a long study's finished runs where a replaced machine cannot lose them, and put them back.

A study folder lives on one machine; when that machine is replaced, every finished run is lost with it (twice so
far for the preregistered SmolLM2 studies: analysis/results/*-smollm2/DEVIATIONS.md). A finished run is known to
a study by its folder ``runs/<name>/`` holding ``summary.json`` (``zfree_lab.run.run_folder``): a rerun of the
study skips it and reads its tables. So the record that lets a new machine skip it is small: the run's top-level
files (config.json, summary.json, per_example.parquet, metrics.jsonl), without its checkpoint (the weights: the
study's tables do not read them), its TensorBoard events (metrics.jsonl holds the same rows) or its executed
notebook (it names the machine's folders).

    python3 analysis/studies/keep_finished.py keep STUDY KEPT      # copy the finished runs' records into KEPT/runs
    python3 analysis/studies/keep_finished.py restore KEPT STUDY   # put them into STUDY/runs where missing

``keep`` adds the runs finished since the last keep and never changes a kept run (a finished run is never
rewritten); ``restore`` never touches a run folder the study already has. Both print how many runs they copied;
``keep`` exits 1 when it refused a run (named on stderr), after keeping the others.
Standard library only (it runs before a study's checkout has its environment). A run's config.json names its
data and base folders relative to the run folder, so a restored run reads the new study's own (prepared again
from the same request). Its metadata may still name the study's folder by its absolute path (the reference's
``source_dir``): ``keep`` writes that path as ``STUDY_TOKEN`` in the text files it keeps and ``restore`` writes
the new study's path in its place, so a restored file reads as if the run had been made there. A file naming
any other machine path is refused by ``keep`` (its record would not be portable).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
from pathlib import Path

#: a finished run's top-level files that are not kept: TensorBoard's copy of metrics.jsonl, the executed notebook
#: (its parameters name the machine's run folder; a study counts a run without one as finished, as one trained by
#: ``zfree train``), hidden files (locks, marks, a notebook's partial copy) and partial writes
SKIP = re.compile(r"^(events\.out\.tfevents\..*|train_cvae\.ipynb|\..*|.*\.tmp|.*\.part)$")
#: absolute paths of a machine (as tests/test_shipped_results.py's check of shipped results)
MACHINE_PATH = re.compile(rb"/work/|/home/|/tmp/|/root/|/Users/|(?<![A-Za-z0-9])[A-Za-z]:\\")
#: the text files it is looked for in (a binary table's bytes match it by chance; its columns hold no paths)
TEXT = {".json", ".jsonl", ".csv", ".txt", ".md"}
#: a run's executed notebook and the mark of one still running (``zfree_lab.experiment.executor``'s names)
NOTEBOOK, RUNNING_MARK = "train_cvae.ipynb", ".notebook-running"
#: what stands for the study folder's absolute path in a kept text file
STUDY_TOKEN = "<zfree-kept-study>"


def _done(run: Path) -> bool:
    """As ``zfree_lab.experiment.executor.is_finished``: summary.json, no error.json, no mark of a notebook still
    running, and the executed notebook (where there is one) reads back whole."""
    nb = run / NOTEBOOK
    if not (run / "summary.json").is_file() or (run / "error.json").exists() or (run / RUNNING_MARK).exists():
        return False
    try:
        return not nb.exists() or isinstance(json.loads(nb.read_bytes()), dict)
    except ValueError:
        return False


def finished_runs(study: Path) -> list[Path]:
    """The finished run folders of ``study`` (or of a kept record), by name."""
    return sorted(p.parent for p in (study / "runs").glob("*/summary.json") if _done(p.parent))


class Refused(Exception):
    """A run whose record would name a machine path."""


def _record(run: Path, study: Path) -> dict[Path, bytes | None]:
    """The files of ``run`` to keep: a text file's bytes with the study's path written as ``STUDY_TOKEN``, None
    for a file copied as it is. Refused when a text file names another machine path."""
    files = [p for p in sorted(run.iterdir()) if p.is_file() and not SKIP.match(p.name)]
    out: dict[Path, bytes | None] = {}
    for p in files:
        if p.suffix not in TEXT:
            out[p] = None
            continue
        data = p.read_bytes().replace(str(study.resolve()).encode(), STUDY_TOKEN.encode())
        if m := MACHINE_PATH.search(data):
            raise Refused(f"{p}: names a machine path ({m.group().decode('utf-8', 'replace')}...); not kept")
        out[p] = data
    return out


def _copy_run(files: dict[Path, bytes | None], dst: Path) -> None:
    """The files into ``dst`` (made new; bytes written where given, else copied), summary.json last and the
    folder renamed into place, so that a copy cut short leaves no folder that looks finished."""
    tmp = dst.with_name(dst.name + ".part")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for p, data in sorted(files.items(), key=lambda kv: kv[0].name == "summary.json"):
        if data is None:
            shutil.copy2(p, tmp / p.name)
        else:
            (tmp / p.name).write_bytes(data)
    tmp.rename(dst)


def keep(study: Path, kept: Path) -> tuple[int, list[str]]:
    """Copy the records of ``study``'s finished runs that ``kept`` lacks into ``kept/runs``: the number copied
    and a line for each run refused (the others are kept all the same)."""
    if not (study / "runs").is_dir():
        raise SystemExit(f"{study}: no runs folder (not a study folder, or no run has started)")
    n, refused = 0, []
    for run in finished_runs(study):
        dst = kept / "runs" / run.name
        if not dst.exists():
            try:
                _copy_run(_record(run, study), dst)
            except Refused as e:
                refused.append(str(e))
                continue
            n += 1
    return n, refused


#: what marks a folder as a study's (``zfree_lab.run.locks.STUDY_MARKS``): a study refuses to write into a
#: non-empty folder without one
MARKS = (".zfree.lock", "plan.json", "spec.json")


def restore(kept: Path, study: Path) -> int:
    """Copy every kept run that ``study/runs`` lacks into it; the number copied. A ``study`` folder that does not
    exist yet is made with the empty lock file a study leaves in its folder (so that the study, started next,
    takes the folder as its own); an existing one must be a study's folder already."""
    if not study.exists():
        study.mkdir(parents=True)
        (study / MARKS[0]).touch()
    elif not any((study / m).exists() for m in MARKS):
        raise SystemExit(f"{study}: exists and is not a study folder (no {' or '.join(MARKS)}); not restored")
    n = 0
    for run in finished_runs(kept):
        dst = study / "runs" / run.name
        if not dst.exists():
            here = str(study.resolve()).encode()
            _copy_run({p: p.read_bytes().replace(STUDY_TOKEN.encode(), here) if p.suffix in TEXT else None
                       for p in sorted(run.iterdir()) if p.is_file()}, dst)
            n += 1
    return n


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    k = sub.add_parser("keep", help="copy STUDY's finished runs' records into KEPT/runs")
    k.add_argument("study", type=Path)
    k.add_argument("kept", type=Path)
    r = sub.add_parser("restore", help="copy KEPT's runs into STUDY/runs where missing")
    r.add_argument("kept", type=Path)
    r.add_argument("study", type=Path)
    a = ap.parse_args(argv)
    if a.cmd == "keep":
        n, refused = keep(a.study, a.kept)
        print(f"kept {n} finished run(s) of {a.study} in {a.kept} ({len(finished_runs(a.kept))} in all)")
        for line in refused:
            print(line, file=sys.stderr)
        return 1 if refused else 0
    else:
        n = restore(a.kept, a.study)
        print(f"restored {n} finished run(s) from {a.kept} into {a.study}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
