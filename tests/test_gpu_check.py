"""The GPU check, as far as a CPU can check it (issue 29, part 6): the emulation profiles
set from published figures, the profile gpu_check writes and emulate loads, the script's
syntax and its dry run."""

from __future__ import annotations

import json
import pathlib
import shutil
import subprocess
import sys

import pytest

from dbml.bench import emulate, gpu_check

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_check.sh"


def test_published_profiles():
    a6000, h100 = emulate.profile("a6000"), emulate.profile("h100")
    assert a6000.flops == 24e12 and 24e9 <= a6000.pcie <= 26e9     # achieved FP32 matmul; PCIe 4.0
    assert h100.pcie == 50e9                                       # PCIe 5.0
    for p in emulate.PROFILES.values():
        assert 0 < p.duplex < p.pcie, p.name                       # both ways at once: slower each
        assert "published" in p.source
    # the kernel rate calibrated against the stated peak (38.7 TFLOPS at 0.35) is kept
    assert emulate.gpu_machine(a6000).peak_flops == pytest.approx(38.7e12 * 0.35, rel=0.01)
    assert emulate.gpu_machine(a6000).memory_bandwidth == pytest.approx(768e9 * 0.35)


def test_a_measured_profile_round_trips_through_json(tmp_path):
    copies = {"h2d": 52e9, "d2h": 48e9, "duplex_h2d": 30e9, "duplex_d2h": 28e9}
    p = gpu_check.measured_profile("nvidia-h100", copies, 40e12, 2.5e12)
    assert (p.pcie, p.duplex, p.flops, p.memory) == (48e9, 28e9, 40e12, 2.5e12)
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(emulate.profile_json(p)))
    assert emulate.profile(str(path)) == p
    # an emulated bandwidth from it keeps its copy-to-compute ratio, as for a named profile
    assert emulate.emulated_bandwidth(p, 0.002, 0.5) == pytest.approx(48e9 * 0.002 / 0.5)


def test_bad_profiles_name_the_fix(tmp_path):
    with pytest.raises(ValueError, match="cannot read the profile .* write one with benchmarks/gpu_check.sh"):
        emulate.profile(str(tmp_path / "missing.json"))
    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps({"format": 99}))
    with pytest.raises(ValueError, match="is not a gpu_check.sh profile of format 1"):
        emulate.profile(str(wrong))
    partial = tmp_path / "partial.json"
    partial.write_text(json.dumps({"format": 1, "name": "x", "flops": 1.0}))
    with pytest.raises(ValueError, match="lacks pcie, source"):
        emulate.profile(str(partial))


def test_dry_run_writes_a_profile_emulate_loads(tmp_path):
    assert gpu_check.main(["--out", str(tmp_path), "--dry-run"]) == 0
    p = emulate.profile(str(tmp_path / "profile.json"))
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert report["dry_run"] and report["workloads"] == []
    assert p.flops == report["matmul_flops"] > 0 and p.pcie > 0 and p.duplex > 0


@pytest.mark.slow   # > 0.5 s on a quiet 2-core machine: out of the inner loop
def test_script_syntax_and_dry_run(tmp_path):
    bash = shutil.which("bash")
    assert subprocess.run([bash, "-n", str(SCRIPT)]).returncode == 0
    out = subprocess.run([bash, str(SCRIPT), "--dry-run", str(tmp_path)], capture_output=True, text=True,
                         env={"PATH": "/usr/bin:/bin", "PYTHON": sys.executable}, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "== tests" in out.stdout and "profile loads: dry-run-cpu" in out.stdout
    assert (tmp_path / "profile.json").exists()
