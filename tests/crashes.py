"""Processes killed at known points, for the crash-safety tests (``test_crash_safety.py``) and
the stateful catalog test (``test_catalog_states.py``).

A fork server (``CrashServer``) imports dbml, torch, Optuna and onnx once and warms them on an
in-memory database; then each ``run <scenario> <database> [args]`` line forks a child, a
fresh process for DuckDB and dbml (the server never opens a file database). A child opens
the file, does its scenario and prints where it is ("at <point>") before it waits there to
be killed with SIGKILL; a scenario that ends by itself prints "done". The points are reached
by what the child sees (a job's row in ``dbml_jobs``, a trial's row written, the catalog's
write begun), never by a fixed sleep, so a kill lands at the same point every run.
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import textwrap
import threading
import time

TABLE = "CREATE TABLE IF NOT EXISTS t AS SELECT range / 256 AS x, (range % 3 = 0)::INT AS y FROM range(256)"
BASE = "SELECT train('base', 't', label := 'y', epochs := 1).version"
TUNE = ("SELECT trial, status FROM tune('k', 't', label := 'y', epochs := 2, sampler := 'grid', parallel := 1, "
        "space := '{\"batch_size\": {\"choice\": [16, 32, 64]}}')")
GRID = {16, 32, 64}

SERVER = textwrap.dedent('''
    import os, resource, shutil, signal, sys, tempfile, time
    import torch
    torch.set_num_threads(1)   # a forked child must not inherit a thread pool's state
    import duckdb, onnx, optuna
    import dbml
    from dbml.core import catalog
    from dbml.search import trials

    TABLE, BASE, TUNE = sys.argv[1:4]


    def say(*words):
        """One line in one write: a child killed mid-print never leaves half a line."""
        os.write(1, (" ".join(map(str, words)) + "\\n").encode())


    def wait_here(point):
        say("at", point)
        while True:
            time.sleep(60)


    def hook(owner, name, point):
        """Replace owner.name with a call that stops at ``point`` (the child waits to be killed)."""
        setattr(owner, name, lambda *args, **kwargs: wait_here(point))


    def job_row(con, condition):
        while True:
            rows = con.execute("SELECT job_id FROM dbml_jobs WHERE " + condition).fetchall()
            if rows:
                return
            time.sleep(0.01)


    def setup(con):
        con.execute(TABLE)
        say("base", con.execute(BASE).fetchall()[0][0])


    def train(con, point, model="m", table="t"):
        """Killed while train() of ``model`` runs: as its job starts, in its second epoch, or with
        the catalog's transaction open (the model row written, its weights not yet)."""
        if point == "commit":
            hook(catalog, "_weights_row", "commit")
            con.execute("SELECT train(?, ?, label := 'y', epochs := 1)", [model, table]).fetchall()
            raise AssertionError("train() stored a model without writing the catalog")
        con.execute("SELECT train(?, ?, label := 'y', epochs := 100000, early_stop := false, wait := false)",
                    [model, table]).fetchall()
        job_row(con, "status = 'running'" if point == "start" else "epoch >= 2")
        wait_here(point)


    def tune(con, statement=TUNE, *params):
        """``statement`` (a tune(), parallel := 1) killed once its first trial has ended and its
        second has just been recorded 'running'."""
        save, started = trials.save, []

        def saved(cur, *records):   # trials.save writes the trials that start or end together at once
            save(cur, *records)
            for record in records:
                say("saved", record["trial"], record["status"])
                if record["status"] == "running":
                    started.append(record["trial"])
            if len(started) == 2:
                wait_here("trial")
        trials.save = saved
        con.execute(statement, list(params)).fetchall()
        raise AssertionError("tune() ended before its second trial")


    def export(con, point, target):
        """Killed inside export_model: after the exporter wrote the temporary file (before the
        metadata is added), or with the file complete, before it is renamed to ``target``."""
        if point == "save":
            hook(onnx, "save", point)
        else:
            hook(os, "replace", point)
        con.execute("SELECT export_model('base', ?, overwrite := true)", [target]).fetchall()


    def hold(con):
        wait_here("holding")


    def full(con, limit):
        """train() under a file size limit (a full disk): its commit fails; what it said, then
        whether the connection still reads the catalog."""
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)   # a write past the limit fails (EFBIG), no signal
        resource.setrlimit(resource.RLIMIT_FSIZE, (int(limit), resource.RLIM_INFINITY))
        try:
            con.execute("SELECT train('big', 't', label := 'y', epochs := 1, hidden := [512, 512])").fetchall()
            say("stored")
        except duckdb.Error as e:
            say("error", str(e).replace("\\n", " "))
        say("models", con.execute("SELECT count(*) FROM dbml_models").fetchall()[0][0])


    SCENARIOS = {"setup": setup, "train": train, "tune": tune, "export": export, "hold": hold, "full": full}


    def child(scenario, db, args):
        con = dbml.connect(db, latency_model="roofline")
        SCENARIOS[scenario](con, *args)
        con.close()
        say("done")


    warm = dbml.connect(latency_model="roofline")
    warm.execute("SET threads = 1")
    warm.execute(TABLE)
    warm.execute(BASE).fetchall()
    warm.execute(TUNE).fetchall()
    folder = tempfile.mkdtemp(prefix="dbml-crash-server-")
    warm.execute("SELECT export_model('base', ?)", [os.path.join(folder, "warm.onnx")]).fetchall()
    shutil.rmtree(folder)
    say("ready")
    for line in sys.stdin:
        command, *words = line.split("\\t")
        words = [w.rstrip("\\n") for w in words]
        if command == "run":
            pid = os.fork()
            if pid == 0:
                try:
                    child(words[0], words[1], words[2:])
                except BaseException as e:
                    say("failed", type(e).__name__, str(e).replace("\\n", " "))
                    os._exit(3)
                os._exit(0)
            say("pid", pid)
        else:   # reap <pid>
            say("exit", os.waitpid(int(words[0]), 0)[1])
''')


class CrashServer:
    """The fork server's process; a thread reads its output as it comes."""

    def __init__(self, stderr):
        self.last = None
        self.proc = subprocess.Popen([sys.executable, "-c", SERVER, TABLE, BASE, TUNE], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=stderr, text=True, bufsize=1)
        self.lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.expect("ready", timeout=180)

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put("")

    def _send(self, *words: str) -> None:
        self.proc.stdin.write("\t".join(words) + "\n")
        self.proc.stdin.flush()

    def expect(self, word: str, timeout: float = 60) -> list[str]:
        """The next line that starts with ``word`` (its words after it); a child's failure raises."""
        end = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, end - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"no {word!r} from the crash server in {timeout} s; last line {self.last!r}") \
                    from None
            self.last = line
            assert line, f"crash server ended (exit {self.proc.poll()}) waiting for {word!r}"
            assert not line.startswith("failed"), f"a child failed: {line}"
            words = line.rstrip("\n").split(" ")
            if words[0] == word:
                return words[1:]

    def run(self, scenario: str, db, *args: str) -> int:
        """Start a child on ``scenario``; its pid."""
        self._send("run", scenario, str(db), *map(str, args))
        return int(self.expect("pid")[0])

    def kill(self, pid: int) -> None:
        """SIGKILL the child and reap it; it must have died of the signal."""
        os.kill(pid, signal.SIGKILL)
        status = self._reap(pid)
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, f"child ended by itself: {status}"

    def finish(self, pid: int) -> None:
        """Wait for the child to print "done" and exit 0."""
        self.expect("done", timeout=120)
        assert self._reap(pid) == 0

    def _reap(self, pid: int) -> int:
        self._send("reap", str(pid))
        return int(self.expect("exit", timeout=30)[0])

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=30)
