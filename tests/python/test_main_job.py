# SPDX-License-Identifier: MIT
"""The main job end to end: examples/digits_eval.py on 4 ranks against a real devald."""

import os
import subprocess
import sys

import pytest

from conftest import ROOT


def test_digits_main_job(daemon, tmp_path):
    pytest.importorskip("sklearn", reason="scikit-learn is not installed")
    env = dict(os.environ, DEVAL_SOCKET=daemon.socket,
               PYTHONPATH=os.path.join(ROOT, "python") + os.pathsep +
               os.environ.get("PYTHONPATH", ""))
    env.pop("RANK", None)
    p = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "digits_eval.py"),
                        "--ranks", "4", "--batch", "16", "--out", str(tmp_path)],
                       env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    out = p.stdout
    assert "rows the ranks evaluated   1000 (3 duplicates" in out
    assert "rows gathered by deval     997" in out
    assert "997 of 997 lines identical" in out
    assert "deval == single process: yes, exactly" in out
    deval_lines = (tmp_path / "predictions.deval.tsv").read_text().splitlines()
    single_lines = (tmp_path / "predictions.single.tsv").read_text().splitlines()
    assert deval_lines == single_lines and len(deval_lines) == 997


def test_digits_on_three_ranks_says_three(daemon, tmp_path):
    """--ranks reaches the ranks, which print it; nothing is left in the temporary directory."""
    pytest.importorskip("sklearn", reason="scikit-learn is not installed")
    env = dict(os.environ, DEVAL_SOCKET=daemon.socket, TMPDIR=str(tmp_path),
               PYTHONPATH=os.path.join(ROOT, "python") + os.pathsep +
               os.environ.get("PYTHONPATH", ""))
    env.pop("RANK", None)
    p = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "digits_eval.py"),
                        "--ranks", "3", "--batch", "16"],
                       env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "digits, 3 ranks, batch 16" in p.stdout, p.stdout
    assert "rows the ranks evaluated   999 (2 duplicates" in p.stdout, p.stdout
    assert "deval == single process: yes, exactly" in p.stdout
    assert [x.name for x in tmp_path.iterdir() if x.name.startswith("deval-digits-")] == []
