"""The console scripts' entry (libarena.entry): a signal while a tool is still importing ends it with one line.

Before, a Ctrl-C in a tool's first few tenths of a second (typer, rich, pyarrow being imported, before run_app
installs its handlers) printed Python's KeyboardInterrupt traceback."""

from __future__ import annotations

import importlib.metadata
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TOOLS = ("analyze", "plan", "profile", "schedule", "run")

#: a stand-in for a tool's main module whose import takes long (it says when it has begun)
SLOW_TOOL = textwrap.dedent("""
    import sys, time
    print("importing", flush=True)
    time.sleep(60)

    def main():
        print("ran", flush=True)
""")


def _start(tmp_path: Path, launcher: str) -> subprocess.Popen:
    (tmp_path / "slow_tool.py").write_text(SLOW_TOOL)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(REPO)]))
    proc = subprocess.Popen([sys.executable, "-c", launcher], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=env, text=True)
    assert proc.stdout.readline().strip() == "importing"
    return proc


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_during_the_imports_is_one_line(tmp_path, signum):
    proc = _start(tmp_path, "from libarena.entry import launch; launch('arena-test', 'slow_tool')")
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=30)
    assert (proc.returncode, err, out) == (2, "arena-test: error: interrupted\n", "")


def test_without_the_entry_a_signal_during_the_imports_is_a_traceback(tmp_path):
    """What the entry is for: the same import started plainly ends in KeyboardInterrupt's traceback."""
    proc = _start(tmp_path, "import signal; signal.signal(signal.SIGINT, signal.default_int_handler); import slow_tool")
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert "Traceback" in err and "KeyboardInterrupt" in err


def test_the_entry_runs_the_tool_once_imported(tmp_path):
    (tmp_path / "quick_tool.py").write_text("def main():\n    print('ran')\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(REPO)]))
    proc = subprocess.run([sys.executable, "-c", "from libarena.entry import launch; launch('arena-test', 'quick_tool')"],
                          capture_output=True, text=True, env=env, timeout=60)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "ran\n", "")


def test_every_console_script_starts_through_the_entry():
    scripts = {ep.name: ep.value for ep in importlib.metadata.entry_points(group="console_scripts")
               if ep.name.startswith("arena-")}
    assert scripts == {f"arena-{tool}": f"arena_{tool}:main" for tool in TOOLS}
    # what the scripts import before the handler is in place is light: not the CLI, typer, rich or the library
    code = ("import sys; " + "; ".join(f"import arena_{tool}" for tool in TOOLS) + "; import libarena.entry; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('typer', 'rich', 'click', 'numpy', 'pyarrow') "
            "or m.startswith('libarena.') and m != 'libarena.entry' or m.endswith('.main'))); ")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert (proc.returncode, proc.stdout.strip()) == (0, "[]"), proc.stderr


def test_a_console_script_still_works():
    exe = Path(sys.executable).with_name("arena-plan")
    proc = subprocess.run([str(exe), "--help"], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, RAY_AUTH_MODE="disabled"))
    assert proc.returncode == 0 and "Usage: arena-plan" in proc.stdout, proc.stderr
