"""JupyterLab starts headless on localhost and serves the lessons."""

import json
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.request

from dlscale.distributed import free_port

from .conftest import ROOT


def test_jupyterlab_serves_the_lesson_notebooks(tmp_path):
    port, token = free_port(), secrets.token_hex(16)
    env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"), "JUPYTER_CONFIG_DIR": str(tmp_path / "cfg")}
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", "--allow-root", "--ip=127.0.0.1", f"--port={port}",
         f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={ROOT}", "--ServerApp.port_retries=0"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, start_new_session=True)
    try:
        listing, deadline = None, time.time() + 90
        while listing is None and time.time() < deadline:
            assert server.poll() is None, server.stderr.read().decode()[-2000:]
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/contents/notebooks?token={token}",
                                            timeout=5) as response:
                    listing = json.load(response)
            except OSError:
                time.sleep(0.5)
        assert listing is not None, "JupyterLab did not answer within 90 s"
        names = {item["name"] for item in listing["content"] if item["type"] == "notebook"}
        assert {"00_environment.ipynb", "01_single_device_baseline.ipynb"} <= names
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/lab?token={token}", timeout=10) as response:
            assert response.status == 200 and b"JupyterLab" in response.read()
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
