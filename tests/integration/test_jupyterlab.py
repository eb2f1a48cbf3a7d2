"""JupyterLab starts headless on localhost and serves the lessons (no browser needed)."""

import urllib.request

from ..browser import LabServer
from ..conftest import ROOT


def test_jupyterlab_serves_the_lesson_notebooks(tmp_path):
    server = LabServer(ROOT, tmp_path)
    try:
        listing = server.get("api/contents/notebooks")
        names = {item["name"] for item in listing["content"] if item["type"] == "notebook"}
        assert {"00_environment.ipynb", "01_single_device_baseline.ipynb"} <= names
        with urllib.request.urlopen(server.url("lab"), timeout=10) as response:
            assert response.status == 200 and b"JupyterLab" in response.read()
    finally:
        server.close()
