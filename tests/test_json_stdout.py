"""``--json``: stdout carries the JSON document and nothing else, whatever writes to fd 1 meanwhile or after.

Under Ray the driver prints its workers' log lines to stdout as they arrive,
also after the engine is gone; a child process inherits fd 1. Both are
played here by real writers (a child process, a thread writing after the
document) around the same :class:`~ascend_kernel.cli.main.JsonStdout` the
commands use, in a process of its own so its fd 1 is a pipe this test reads.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import os, subprocess, sys, threading, time
    from ascend_kernel.cli.main import JsonStdout

    out = JsonStdout().claim()
    print("engine log line via print")
    subprocess.run([sys.executable, "-c", "print('a child process writes to its fd 1')"], check=True)
    os.write(1, b"a raw write to fd 1\\n")
    late = threading.Thread(target=lambda: (time.sleep(0.3), os.write(1, b"a worker line after the engine\\n")))
    late.start()
    out.write('{"outputs": [1, 2]}')
    late.join()
""")


def test_writers_to_fd1_never_reach_stdout():
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {"outputs": [1, 2]}, proc.stdout
    for line in ("engine log line via print", "a child process writes to its fd 1", "a raw write to fd 1",
                 "a worker line after the engine"):
        assert line in proc.stderr


def test_the_command_line_keeps_stdout_for_the_document(tmp_path):
    """A real command: ``settings --json`` through ``python -m ascend_kernel.cli.main``."""
    proc = subprocess.run([sys.executable, "-m", "ascend_kernel.cli.main", "settings", "--json"], capture_output=True,
                          text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "settings" in json.loads(proc.stdout)


def test_in_process_callers_get_their_stdout_back(capfd):
    from ascend_kernel.cli.main import main

    assert main(["settings", "--json"]) == 0
    captured = capfd.readouterr()
    assert "settings" in json.loads(captured.out)
    print("after")
    assert capfd.readouterr().out == "after\n"
