# SPDX-License-Identifier: MIT
"""devald under systemd: the units verify, socket activation hands devald its listening
socket, and the notify protocol (READY, STATUS, WATCHDOG, STOPPING) speaks as it should."""

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time

import pytest

import deval
from conftest import ROOT, devald_path

BUILD = os.path.dirname(devald_path())


def test_units_verify(tmp_path):
    if not shutil.which("systemd-analyze"):
        pytest.skip("systemd-analyze is not installed")
    service = open(os.path.join(BUILD, "devald.service")).read()
    service = service.replace("/usr/local/sbin/devald", devald_path())
    assert "/usr/local/sbin" not in service
    (tmp_path / "devald.service").write_text(service)
    shutil.copy(os.path.join(ROOT, "tools", "systemd", "devald.socket"), tmp_path)
    p = subprocess.run(["systemd-analyze", "verify", "--man=no",
                        str(tmp_path / "devald.service"), str(tmp_path / "devald.socket")],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and not p.stderr.strip(), p.stderr


def test_socket_activation():
    if not shutil.which("systemd-socket-activate"):
        pytest.skip("systemd-socket-activate is not installed")
    d = tempfile.mkdtemp(prefix="deval-sa-")
    path = os.path.join(d, "devald.sock")
    act = subprocess.Popen(["systemd-socket-activate", "--seqpacket", "-l", path,
                            devald_path(), "--log-level", "info"],
                           stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 5
        while not os.path.exists(path):
            assert time.monotonic() < deadline, "the socket never appeared"
            time.sleep(0.02)
        # the first connection starts devald on the inherited socket
        with deval.join("activated", 0, 1, socket=path, timeout=10) as g:
            assert g.gather(5).tolist() == [5]
        out = subprocess.run([os.path.join(BUILD, "deval-ctl"), "--socket", path, "status"],
                             capture_output=True, text=True, timeout=10)
        assert out.returncode == 0 and "backend host" in out.stdout, out.stdout + out.stderr
    finally:
        act.send_signal(signal.SIGTERM)
        err = act.communicate(timeout=10)[1]
        assert act.returncode == 0, err
    assert "(from systemd)" in err, err
    assert os.path.exists(path), "devald must leave an activated socket's file to systemd"
    os.unlink(path)
    os.rmdir(d)


def test_notify_protocol():
    d = tempfile.mkdtemp(prefix="deval-notify-")
    notify_path = os.path.join(d, "notify")
    sock_path = os.path.join(d, "devald.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    listener.bind(notify_path)
    listener.settimeout(5)
    env = dict(os.environ, NOTIFY_SOCKET=notify_path, WATCHDOG_USEC="200000")
    env.pop("WATCHDOG_PID", None)
    proc = subprocess.Popen([devald_path(), "--socket", sock_path, "--log-level", "warn"],
                            env=env)

    def until(pred, what):
        seen = []
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            msg = listener.recv(4096).decode()
            seen.append(msg)
            if pred(msg):
                return msg
        raise AssertionError("no %s; got %r" % (what, seen))

    try:
        ready = until(lambda m: "READY=1" in m, "READY=1")
        assert "STATUS=" in ready
        t0 = time.monotonic()
        until(lambda m: m == "WATCHDOG=1", "WATCHDOG=1")
        until(lambda m: m == "WATCHDOG=1", "a second WATCHDOG=1")
        assert time.monotonic() - t0 < 0.5  # every 100 ms, half of WATCHDOG_USEC
        with deval.join("notified", 0, 1, socket=sock_path, timeout=10):
            until(lambda m: m.startswith("STATUS=") and "1 group" in m, "STATUS with 1 group")
        proc.send_signal(signal.SIGTERM)
        until(lambda m: "STOPPING=1" in m, "STOPPING=1")
        assert proc.wait(5) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        listener.close()
        shutil.rmtree(d, ignore_errors=True)
