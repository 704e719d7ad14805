"""The wheel carries rules/ and extract/, and an installed copy finds them."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_wheel_ships_the_rule_files_and_cost_models_and_finds_them(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w",
                    str(tmp_path), str(ROOT)], check=True, timeout=600)
    wheel = next(tmp_path.glob("eqsat_fuse-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    for rule_file in (ROOT / "rules").glob("*.egg"):
        assert f"eqsat_fuse/data/rules/{rule_file.name}" in names
    for cost_file in (ROOT / "extract").glob("*.toml"):
        assert f"eqsat_fuse/data/extract/{cost_file.name}" in names
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--quiet", "--target",
                    str(target), str(wheel)], check=True, timeout=600)
    probe = ("import eqsat_fuse, eqsat_fuse.resources as r; "
             "print(eqsat_fuse.__file__); print(r.data_dir('rules')); print(r.data_dir('extract'))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True, cwd=tmp_path, env={"PYTHONPATH": str(target)}).stdout.split()
    assert all(line.startswith(str(target)) for line in out), out
