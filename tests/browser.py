"""JupyterLab in headless Chromium, driven by Playwright, as a student uses the series.

The server runs on 127.0.0.1 with a random token and throw-away configuration, data, runtime,
settings and IPython folders, over a throw-away copy of notebooks/ (what it runs, it saves); Chromium is the system's (Debian's package), which Playwright drives
through its ``executable_path`` (``playwright install`` is never run: it would download a browser).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def chromium_path() -> tuple[str | None, str]:
    """(path, '') of a Chromium to drive, or (None, why not)."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path, ""
    return None, ("no Chromium here: `.ci/run` installs Debian's package when run as root "
                  "(apt-get install chromium); as a normal user, install it to run these tests")


def playwright_or_why():
    try:
        from playwright.sync_api import sync_playwright  # noqa: F401
    except ImportError:
        return "the playwright package is not installed (make setup installs it)"
    return ""


class Lab:
    """A JupyterLab server over notebooks/ (in a with block), and a page driver for it."""

    def __init__(self, notebooks: Path = ROOT / "notebooks", environment: dict | None = None):
        """``environment``: variables to set for the server and its kernels, beside this process's own."""
        self.token = secrets.token_hex(16)
        self.environment = dict(environment or {})
        self.folder = Path(tempfile.mkdtemp(prefix="nnlib-lab-"))
        # JupyterLab saves a notebook it has run (autosave): it serves a copy, never the saved lessons
        self.root_dir = self.folder / "notebooks"
        shutil.copytree(notebooks, self.root_dir, ignore=shutil.ignore_patterns(".ipynb_checkpoints"))

    def __enter__(self):
        probe = socket.socket()
        probe.bind(("127.0.0.1", 0))
        self.port = probe.getsockname()[1]
        probe.close()
        settings = self.folder / "settings"
        for plugin, values in {"@jupyterlab/apputils-extension/notification": {"fetchNews": "false",
                                                                                "checkForUpdates": False},
                               "@jupyterlab/notebook-extension/tracker": {"windowingMode": "none"}}.items():
            path = settings / f"{plugin}.jupyterlab-settings"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(values))
        environment = dict(os.environ, JUPYTER_CONFIG_DIR=str(self.folder / "config"),
                           JUPYTER_DATA_DIR=str(self.folder / "data"), JUPYTER_RUNTIME_DIR=str(self.folder / "runtime"),
                           JUPYTERLAB_SETTINGS_DIR=str(settings), JUPYTERLAB_WORKSPACES_DIR=str(self.folder / "ws"),
                           IPYTHONDIR=str(self.folder / "ipython"))
        environment.update(self.environment)
        self.log = open(self.folder / "server.log", "w")
        self.server = subprocess.Popen(
            [sys.executable, "-m", "jupyterlab", "--no-browser", "--allow-root", "--ip=127.0.0.1",
             f"--port={self.port}", f"--IdentityProvider.token={self.token}", f"--ServerApp.root_dir={self.root_dir}"],
            env=environment, stdout=subprocess.DEVNULL, stderr=self.log)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.server.poll() is not None:
                raise RuntimeError("JupyterLab did not start:\n" + (self.folder / "server.log").read_text()[-3000:])
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.2)
        return self

    def __exit__(self, *exc_info):
        self.server.terminate()
        try:
            self.server.wait(20)
        except subprocess.TimeoutExpired:
            self.server.kill()
            self.server.wait()
        self.log.close()
        shutil.rmtree(self.folder, ignore_errors=True)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}/{path}?token={self.token}"

    def kernels(self) -> list:
        import urllib.request

        with urllib.request.urlopen(self.url("api/kernels"), timeout=10) as reply:
            return json.loads(reply.read())


IDLE = "() => document.querySelector('.jp-Notebook-ExecutionIndicator')?.getAttribute('data-status') === 'idle'"
ALL_RAN = """() => { const prompts = [...document.querySelectorAll('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-CodeCell .jp-InputArea-prompt')];
    return prompts.length > 0 && prompts.every(p => /\\[\\d+\\]/.test(p.textContent)) &&
           document.querySelector('.jp-Notebook-ExecutionIndicator')?.getAttribute('data-status') === 'idle'; }"""


ANY_RAN = """() => [...document.querySelectorAll('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-CodeCell .jp-InputArea-prompt')]
    .some(p => /\\[\\d+\\]/.test(p.textContent))"""
STALLED_RESTART_S = 120  # no cell has run this long after a restart: the restart did not come back


def open_notebook(page, lab: Lab, name: str) -> None:
    """Open ``name`` alone, in a fresh workspace (JupyterLab would reopen earlier tabs otherwise)."""
    page.goto(lab.url(f"lab/workspaces/{secrets.token_hex(4)}/tree/{name}"))
    page.wait_for_selector(".jp-NotebookPanel .jp-Cell", timeout=90_000)
    try:
        page.click(".jp-Dialog .jp-mod-accept", timeout=3_000)  # "Select Kernel", if JupyterLab asks
    except Exception:
        pass
    page.wait_for_function(IDLE, timeout=90_000)


def menu(page, top: str, item: str) -> None:
    page.click(f".lm-MenuBar-itemLabel:text-is('{top}')")
    page.click(f".lm-Menu-itemLabel:text-is('{item}')")


def restart_and_run_all(page, timeout_s: float = 300) -> None:
    """Kernel > Restart Kernel and Run All Cells..., confirmed; returns when every code cell has run.

    On a loaded machine JupyterLab's restart sometimes never comes back: every prompt stays [*] and no cell
    runs (seen in CI and in fresh-clone runs, on lessons 02 and 04, with no error). If no cell has run
    after STALLED_RESTART_S, the restart is asked for once more, as a student would; a second stall fails."""
    for attempt in (1, 2):
        menu(page, "Kernel", "Restart Kernel and Run All Cells…")
        page.click(".jp-Dialog .jp-mod-accept", timeout=10_000)
        page.wait_for_function("() => [...document.querySelectorAll('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-CodeCell .jp-InputArea-prompt')]"
                               ".some(p => p.textContent.includes('*') || p.textContent.trim() === '')", timeout=30_000)
        try:
            page.wait_for_function(ANY_RAN, timeout=STALLED_RESTART_S * 1000)
            break
        except Exception:
            if attempt == 2:
                raise
    try:
        page.wait_for_function(ALL_RAN, timeout=timeout_s * 1000)
    except Exception as error:  # say where Run All stopped: the prompts and the page's last lines
        shown = what_the_page_shows(page)
        raise AssertionError(f"Run All did not finish within {timeout_s:g} s ({error.__class__.__name__}): prompts "
                             f"{shown['prompts']}, {shown['errors']} error outputs; the page ends:\n"
                             f"{shown['text'][-3000:]}") from error


VISIBLE = ".jp-NotebookPanel:not(.lm-mod-hidden)"


def what_the_page_shows(page) -> dict:
    """The visible notebook's prompts, error and stderr outputs, figures and text."""
    prompts = page.eval_on_selector_all(f"{VISIBLE} .jp-CodeCell .jp-InputArea-prompt",
                                        "els => els.map(e => e.textContent)")
    return {
        "prompts": prompts,
        "errors": page.locator(f"{VISIBLE} .jp-OutputArea-output[data-mime-type='application/vnd.jupyter.error']").count(),
        "stderr": page.locator(f"{VISIBLE} .jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']").count(),
        "images": page.locator(f"{VISIBLE} .jp-OutputArea-output img").count(),
        "text": page.inner_text(f"{VISIBLE} .jp-Notebook"),
    }
