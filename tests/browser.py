"""JupyterLab driven by a real headless Chromium, the way an attendee runs a lesson.

:class:`LabServer` starts JupyterLab on localhost (a token; its own config, runtime and settings
folders). :class:`Lab` adds one Chromium through Selenium and Debian's chromedriver;
:meth:`Lab.run_all` opens a notebook in a workspace of its own, checks the kernel, clicks
Run → Run All Cells, waits until nothing is queued or running, saves, and returns a
:class:`Page`: what the browser shows and what the saved notebook holds. :func:`problems` lists
what an attendee would see go wrong.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import nbformat

from dlscale.distributed import free_port

from .notebooks import errors, has_image

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")

#: JupyterLab settings for the test: every cell in the page (not only the visible ones), no news pop-up.
SETTINGS = {
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {"fetchNews": "false"},
}


#: The notebook in front: earlier notebooks may stay open in hidden tabs.
PANEL = ".jp-NotebookPanel:not(.lm-mod-hidden)"


def missing() -> str | None:
    """Why the browser tests cannot run here, or None."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -e '.[dev]'); the lessons ran headless instead"
    if not (CHROMIUM and CHROMEDRIVER):
        return (
            "Chromium or chromedriver is missing: make browser-packages (as root on Debian/Ubuntu); "
            "their lessons ran headless instead"
        )
    return None


@dataclass
class Page:
    """One notebook after Run All: the saved file, the browser's view, and a screenshot."""

    notebook: nbformat.NotebookNode
    kernel_label: str
    rendered_images: int
    broken_images: int
    progress_widgets: int
    widget_errors: int
    rendered_tables: int
    screenshot: Path

    def outputs(self, mime: str) -> int:
        return sum(mime in output.get("data", {}) for cell in self.notebook.cells for output in cell.get("outputs", []))

    def last_code_cell(self) -> nbformat.NotebookNode:
        return [cell for cell in self.notebook.cells if cell.cell_type == "code"][-1]

    def last_output_text(self) -> str:
        return "".join(output.get("text", "") for output in self.last_code_cell().get("outputs", []))


def problems(page: Page, last_output: str | None, figure_last: bool, bar_expected: bool) -> list[str]:
    """What an attendee would see go wrong: error cells, figures not drawn, widgets broken, a wrong ending."""
    found = [f"cell {index}: {name}: {message}" for index, name, message in errors(page.notebook)]
    saved_images = page.outputs("image/png")
    if page.rendered_images < saved_images or page.broken_images:
        found.append(f"{saved_images} figures were made but {page.rendered_images - page.broken_images} are shown")
    tables = sum(
        "|---" in output.get("data", {}).get("text/markdown", "")
        for cell in page.notebook.cells
        for output in cell.get("outputs", [])
    )
    if page.rendered_tables < tables:
        found.append(f"{tables} Markdown tables were shown but {page.rendered_tables} are drawn as tables")
    if page.widget_errors:
        found.append(f"{page.widget_errors} widget(s) show 'Error displaying widget' or stay at 'Loading widget...'")
    # Every widget the lessons show is a tqdm bar: each must be drawn as one, not left as text.
    bars = page.outputs("application/vnd.jupyter.widget-view+json")
    if page.progress_widgets != bars or bar_expected and not bars:
        found.append(f"{bars} widget outputs, {page.progress_widgets} progress bars drawn")
    if figure_last and not has_image(page.last_code_cell()):
        found.append("the last cell shows no figure")
    if last_output and not re.search(last_output, page.last_output_text()):
        found.append(f"the last cell's text does not match {last_output!r}: {page.last_output_text()[-500:]!r}")
    return found


class LabServer:
    """JupyterLab on 127.0.0.1 with a token, serving ``root``; its config, runtime, settings and log in ``folder``."""

    def __init__(self, root: Path, folder: Path, data_dir: Path | None = None):
        self.port, self.token = free_port(), secrets.token_hex(16)
        settings = folder / "lab-settings"
        for name, values in SETTINGS.items():
            path = settings / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(values))
        env = {
            **os.environ,
            "JUPYTER_RUNTIME_DIR": str(folder / "runtime"),
            "JUPYTER_CONFIG_DIR": str(folder / "config"),
            "JUPYTERLAB_SETTINGS_DIR": str(settings),
        }
        if data_dir:
            env["JUPYTER_DATA_DIR"] = str(data_dir)
        self.log_path = folder / "jupyterlab.log"
        self.log = self.log_path.open("w")
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "jupyterlab",
                "--no-browser",
                "--allow-root",
                "--ip=127.0.0.1",
                f"--port={self.port}",
                f"--IdentityProvider.token={self.token}",
                f"--ServerApp.root_dir={root}",
                "--ServerApp.port_retries=0",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        try:
            self._wait_until_up()
        except AssertionError:
            self.close()
            raise

    def _wait_until_up(self, seconds: float = 90) -> None:
        deadline = time.time() + seconds
        while time.time() < deadline:
            assert self.process.poll() is None, self.log_path.read_text()[-2000:]
            try:
                self.get("api/status")
                return
            except OSError:
                time.sleep(0.5)
        raise AssertionError(f"JupyterLab did not answer within {seconds:.0f} s")

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}/{path}?token={self.token}"

    def get(self, path: str, method: str = "GET"):
        """The REST API's JSON answer (None when it has no body)."""
        with urllib.request.urlopen(urllib.request.Request(self.url(path), method=method), timeout=30) as response:
            body = response.read()
        return json.loads(body) if body else None

    def close(self) -> None:
        os.killpg(self.process.pid, signal.SIGTERM)
        self.process.wait(timeout=30)
        self.log.close()


class Lab:
    """One JupyterLab server and one headless Chromium, shared by the browser tests."""

    def __init__(self, work: Path, data_dir: Path):
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service

        self.work, self.opened = work, 0
        self.server = LabServer(work, work.parent, data_dir)
        options = webdriver.ChromeOptions()
        options.binary_location = CHROMIUM
        for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,1400"):
            options.add_argument(argument)
        try:
            self.driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
        except Exception:
            self.server.close()
            raise

    def shutdown_kernels(self) -> None:
        """End every session, so the next lesson does not share the CPUs with the last one's kernel."""
        for session in self.server.get("api/sessions"):
            self.server.get(f"api/sessions/{session['id']}", method="DELETE")

    def close(self) -> None:
        try:
            self.driver.quit()
        finally:
            self.server.close()

    def _wait(self, condition, seconds: float, what: str):
        from selenium.common.exceptions import StaleElementReferenceException

        deadline = time.time() + seconds
        while time.time() < deadline:
            try:
                value = condition()
            except StaleElementReferenceException:  # JupyterLab redrew the element while we read it
                value = None
            if value:
                return value
            time.sleep(0.5)
        raise AssertionError(f"timed out after {seconds:.0f} s waiting for {what}")

    def _menu(self, menu: str, command: str) -> None:
        from selenium.webdriver.common.by import By

        self.driver.find_element(
            By.XPATH, f"//div[contains(@class, 'lm-MenuBar-itemLabel') and text()='{menu}']"
        ).click()
        self._wait(
            lambda: self.driver.find_elements(By.CSS_SELECTOR, f"li.lm-Menu-item[data-command='{command}']"),
            30,
            f"the menu item {command}",
        )[0].click()

    def _find(self, selector: str) -> list:
        """Elements of the notebook in front."""
        from selenium.webdriver.common.by import By

        return self.driver.find_elements(By.CSS_SELECTOR, f"{PANEL} {selector}")

    def _prompts(self) -> list[str]:
        """Every code cell's prompt ("[ ]:", "[*]:", "[3]:"), read in one call: the wait for Run All polls this
        twice a second, and an element's text, read one at a time, is a round trip to the browser per cell."""
        return self.driver.execute_script(
            "return Array.from(document.querySelectorAll(arguments[0])).map(p => p.textContent.trim())",
            f"{PANEL} .jp-CodeCell .jp-InputArea-prompt",
        )

    def _idle(self) -> bool:
        return bool(self._find(".jp-Notebook-ExecutionIndicator[data-status='idle']"))

    def _kernel_label(self) -> str:
        labels = self._find(".jp-Toolbar-kernelName")
        return labels[0].text if labels else ""

    def _kernel_idle(self, name: str) -> bool:
        """The server has a session for ``name`` whose kernel is idle."""
        return any(
            session["path"] == name and session["kernel"]["execution_state"] == "idle"
            for session in self.server.get("api/sessions")
        )

    def _choose_kernel(self, kernel: str) -> None:
        """Click the notebook's kernel name and pick the kernel whose display name starts with ``kernel``."""
        from selenium.webdriver.common.by import By
        from selenium.webdriver.support.select import Select

        driver = self.driver
        self._find(".jp-Toolbar-kernelName")[0].click()
        menu = Select(
            self._wait(
                lambda: driver.find_elements(By.CSS_SELECTOR, ".jp-Dialog select"), 30, "the Select Kernel dialog"
            )[0]
        )
        offered = [option.text for option in menu.options]
        chosen = [text for text in offered if text.startswith(kernel)]
        assert chosen, f"JupyterLab offers no {kernel!r} kernel, only {offered}: run `make kernel`"
        menu.select_by_visible_text(chosen[0])
        driver.find_element(By.CSS_SELECTOR, ".jp-Dialog .jp-Dialog-button.jp-mod-accept").click()

    def _open_on_kernel(self, name: str, kernel: str) -> str:
        """Open ``name`` in a workspace of its own and switch it to ``kernel``; the kernel label shown."""
        # Only this notebook is open in the workspace, so Run All cannot reach an earlier tab.
        self.opened += 1
        self.driver.get(self.server.url(f"lab/workspaces/run-{self.opened}/tree/{name}"))
        # The lesson opens on the kernel it was saved with; then the attendee picks the README's one.
        self._wait(
            lambda: self._kernel_label() not in ("", "No Kernel") and self._idle() and self._kernel_idle(name),
            300,
            f"{name}'s saved kernel to start",
        )
        self._choose_kernel(kernel)
        return self._wait(
            lambda: self._kernel_label().startswith(kernel) and self._idle() and self._kernel_label(),
            300,
            f"the {kernel} kernel to start",
        )

    def _run_every_cell(self, name: str, seconds: float) -> None:
        """Run → Run All Cells, then wait until nothing is queued or running, and save."""
        from selenium.webdriver.common.by import By

        self._menu("Run", "runmenu:run-all")
        self._wait(lambda: any(p != "[ ]:" for p in self._prompts()), 60, f"Run All to start on {name}")
        # After an error cell the kernel drops the queue and the cells below go back to "[ ]:", so
        # waiting for every cell to have a number would hang.
        self._wait(lambda: "[*]:" not in self._prompts() and self._idle(), seconds, f"the cells of {name} to finish")
        self._menu("File", "docmanager:save")
        self._wait(
            lambda: not self.driver.find_elements(By.CSS_SELECTOR, ".jp-mod-current.jp-mod-dirty"),
            30,
            f"{name} to be saved",
        )

    def _read_page(self, name: str, label: str, screenshot: Path) -> Page:
        """What the page shows once its widgets and figures are drawn, with a screenshot of the last cell."""
        driver = self.driver

        def notebook_text() -> str:
            return self._find(".jp-Notebook")[0].text

        def images() -> list[list[bool]]:  # [loaded, has pixels] per output image, read in one step
            return driver.execute_script(
                "return Array.from(document.querySelectorAll(arguments[0])).map(i => [i.complete, i.naturalWidth > 0])",
                f"{PANEL} .jp-OutputArea-output img",
            )

        def drawn() -> bool:  # a widget or an image whose data has just arrived may still be drawing
            return "Loading widget..." not in notebook_text() and all(loaded for loaded, _ in images())

        try:
            self._wait(drawn, 30, "the widgets and figures to be drawn")
        except AssertionError:
            pass  # what is still not drawn is counted below
        shown, text = images(), notebook_text()
        driver.execute_script("arguments[0].scrollIntoView({block: 'end'})", self._find(".jp-CodeCell")[-1])
        driver.save_screenshot(str(screenshot))
        return Page(
            notebook=nbformat.read(self.work / name, as_version=4),
            kernel_label=label,
            rendered_images=len(shown),
            broken_images=sum(not pixels for _, pixels in shown),
            progress_widgets=len(self._find(".jp-OutputArea-output .jupyter-widgets.widget-hprogress")),
            widget_errors=text.count("Error displaying widget") + text.count("Loading widget..."),
            rendered_tables=len(self._find(".jp-OutputArea-output table")),
            screenshot=screenshot,
        )

    def run_all(self, name: str, kernel: str, screenshot: Path, seconds: float = 900) -> Page:
        """Open ``name``, pick the kernel ``kernel`` names, Run All Cells, wait, save; what the page shows."""
        self.shutdown_kernels()
        label = self._open_on_kernel(name, kernel)
        self._run_every_cell(name, seconds)
        return self._read_page(name, label, screenshot)


#: Run in a deck once reveal.js is ready: every slide shown in turn through reveal.js's API, and what would not show on
#: it at the window's size: content taller or wider than the slide, an element outside the slide's box or scrolling
#: inside it, an image not drawn (no pixels) or not inside the window. The speaker notes are not shown, so not checked.
SLIDE_CHECK = """
const done = arguments[arguments.length - 1];
function check() {
  const {width, height} = Reveal.getConfig();
  const slides = [];
  for (const slide of Reveal.getSlides()) {
    const {h, v} = Reveal.getIndices(slide);
    Reveal.slide(h, v);
    const box = document.querySelector('.reveal .slides').getBoundingClientRect();
    const problems = [];
    if (slide.scrollHeight > height + 1 || slide.scrollWidth > width + 1)
      problems.push(`${slide.scrollWidth}x${slide.scrollHeight} px of content in a ${width}x${height} slide`);
    for (const e of slide.querySelectorAll('*')) {
      const r = e.getBoundingClientRect(), style = getComputedStyle(e);
      if (e.closest('aside.notes') || (!r.width && !r.height)) continue;
      if (r.left < box.left - 1 || r.top < box.top - 1 || r.right > box.right + 1 || r.bottom > box.bottom + 1)
        problems.push(`a ${e.tagName} outside the slide: ${[r.left, r.top, r.right, r.bottom].map(Math.round)}`);
      if ((style.overflowY != 'visible' && e.scrollHeight > e.clientHeight + 1)
          || (style.overflowX != 'visible' && e.scrollWidth > e.clientWidth + 1))
        problems.push(`a ${e.tagName} scrolls`);
    }
    const images = Array.from(slide.querySelectorAll('img'));
    for (const img of images) {
      const r = img.getBoundingClientRect();
      if (!img.complete || !img.naturalWidth || !img.naturalHeight) problems.push('an image with no pixels');
      else if (r.width < 100 || r.left < 0 || r.top < 0 || r.right > innerWidth || r.bottom > innerHeight)
        problems.push(`an image not in the window: ${[r.left, r.top, r.right, r.bottom].map(Math.round)}`);
    }
    const title = slide.querySelector('h1, h2, h3, h4');
    slides.push({h, v, title: title ? title.textContent.trim() : '', images: images.length,
                 problems: Array.from(new Set(problems))});
  }
  done({ready: true, slides, window: [innerWidth, innerHeight]});
}
// (the deck's scripts may run after the driver's page load returns on a busy machine: wait up to 20 s for reveal.js)
const asked = Date.now();
(function start() {
  if (window.Reveal && Reveal.isReady()) check();
  else if (window.Reveal) Reveal.on('ready', check);
  else if (Date.now() - asked < 20000) setTimeout(start, 100);
  else done({ready: false});
})();
"""


def offline_chromium(width: int, height: int):
    """A headless Chromium whose window is ``width`` × ``height`` and that resolves no host name: a page that fetches
    anything but local files finds no network."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        f"--window-size={width},{height}",
        "--host-resolver-rules=MAP * ~NOTFOUND",
    ):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"performance": "ALL"})  # (every request the page makes)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_script_timeout(60)
    driver.execute_cdp_cmd(
        "Emulation.setDeviceMetricsOverride",
        {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
    )
    return driver


def deck_slides(driver, deck: Path) -> dict:
    """``deck`` opened from its file and every slide checked (:data:`SLIDE_CHECK`): whether reveal.js started, each
    slide's title, images and problems, and the address of every request the page made (``fetched``)."""
    driver.get_log("performance")  # (the requests of the page before, left behind)
    driver.get(deck.resolve().as_uri())
    shown = driver.execute_async_script(SLIDE_CHECK)
    events = [json.loads(entry["message"])["message"] for entry in driver.get_log("performance")]
    shown["fetched"] = [
        event["params"]["request"]["url"] for event in events if event["method"] == "Network.requestWillBeSent"
    ]
    return shown
