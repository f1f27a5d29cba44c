"""Larger than memory (issue 29's goal): under ``SET memory_limit = '1GB'``, a model whose eager
training needs more than that trains from SQL, while a query beside it spills, each in a fresh
process measured from outside.

* ``eager``: the model's plain PyTorch step on the same batch, no limit: what it would need
  (the process's resident high-water mark less its resident set before).
* ``dbml``: a database with ``memory_limit = '1GB'`` and its ``temp_directory`` on disk; one
  thread runs ``train(..., policy := 'tensile')`` with the default budget (half the limit),
  another a hash join that spills; the join's result is checked, the job must finish; the
  process's peak is reported against the limit.

``python -m benchmarks.larger_than_memory`` prints both rows (and the load).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time

HIDDEN = [2048] * 18      # ~77M parameters: Adam's eager step needs more than 1 GB
FEATURES, ROWS, BATCH = 784, 2048, 256

EAGER = textwrap.dedent(f"""
    import json, torch
    from dbml.scheduler import procmem
    from dbml.zoo import Inputs, build
    torch.manual_seed(0)
    model = build("mlp", Inputs("tabular", features={FEATURES}), 10, {{"hidden": {HIDDEN}}})
    x, y = torch.randn({BATCH}, {FEATURES}), torch.randint(0, 10, ({BATCH},))
    with procmem.watch() as w:
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    print(json.dumps({{"method": "eager", "real_bytes": w.result.added}}))
""")

DBML = textwrap.dedent(f"""
    import json, resource, sys, threading, time
    import dbml
    from dbml.scheduler import procmem
    tmp = sys.argv[1]
    con = dbml.connect(tmp + "/big.duckdb")
    con.execute(f"SET temp_directory = '{{tmp}}/spill'")
    con.execute("SET memory_limit = '1GB'")
    con.execute("CREATE TABLE d AS SELECT [random()::FLOAT for j in range({FEATURES})]::FLOAT[{FEATURES}] x, (i % 10)::INT y "
                "FROM range({ROWS}) t(i)")
    con.execute("CREATE TABLE a AS SELECT i AS k, i * 2 AS v FROM range(20000000) t(i)")
    con.execute("CREATE TABLE b AS SELECT i AS k, i * 3 AS w FROM range(20000000) t(i)")
    out = {{}}
    def join():
        c = con.cursor()
        t0 = time.time()
        out["join"] = c.execute("SELECT count(*), sum(v + w) FROM a JOIN b USING (k)").fetchone()
        out["join_seconds"] = time.time() - t0
    before = procmem.rss_bytes()
    t = threading.Thread(target=join)
    t0 = time.time()
    t.start()
    r = con.cursor().execute("SELECT train('big', 'SELECT x, y FROM d', label := 'y', arch := 'mlp', hidden := {HIDDEN}, "
                    "epochs := 1, batch_size := {BATCH}, validation := 0, early_stop := false) AS s").fetchone()[0]
    t.join()
    n = 20000000
    out.update(method="dbml", status=r["status"], seconds=time.time() - t0, budget=r["budget_bytes"],
               tracked=r["measured_peak_bytes"], real=r["real_peak_bytes"], spilled=r["spilled_peak_bytes"],
               swaps=r["swaps"], recomputes=r["recomputes"], join_right=out["join"] == (n, 5 * n * (n - 1) // 2),
               hwm=procmem.hwm_bytes(), before=before,
               limit_after=con.execute("SELECT current_setting('memory_limit')").fetchone()[0])
    print(json.dumps(out))
""")


def main() -> int:
    load = os.getloadavg()[0]
    rows = []
    with tempfile.TemporaryDirectory(prefix="dbml-ltm-", dir=os.getcwd()) as tmp:
        for name, script, args in (("eager", EAGER, []), ("dbml", DBML, [tmp])):
            t0 = time.time()
            p = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True)
            lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
            row = json.loads(lines[-1]) if lines else {"method": name, "error": p.stderr.strip()[-400:]}
            row["wall"] = time.time() - t0
            rows.append(row)
            print(json.dumps(row))
    print(f"load average {load:.1f} -> {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
