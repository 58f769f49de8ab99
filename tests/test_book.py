"""`make book`: the series as a static HTML site, built offline from the notebooks' saved outputs."""

import json
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted(path.stem for path in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


class Links(HTMLParser):
    def __init__(self):
        super().__init__()
        self.links = []

    def handle_starttag(self, tag, attributes):
        for name, value in attributes:
            if name in ("href", "src") and value:
                self.links.append(value)


@pytest.fixture(scope="module")
def book(tmp_path_factory):
    output = tmp_path_factory.mktemp("book") / "html"
    run = subprocess.run([sys.executable, str(ROOT / "book" / "build.py"), str(output)], capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr  # -W: any Sphinx warning fails the build
    return output


def test_every_lesson_is_a_page_in_the_series_order_after_the_readme_introduction(book):
    index = (book / "index.html").read_text()
    assert "how neural-network training is parallelized" in index
    positions = [index.find(f'href="{name}.html"') for name in NOTEBOOKS]
    assert -1 not in positions and positions == sorted(positions), positions
    for name in NOTEBOOKS:
        assert (book / f"{name}.html").is_file(), name


def test_every_internal_link_and_image_resolves(book):
    broken = []
    for page in book.rglob("*.html"):
        parser = Links()
        parser.feed(page.read_text())
        for link in parser.links:
            if re.match(r"^[a-z]+:", link) or link.startswith("#"):
                continue  # external (http, mailto, data:) or on the same page
            target = (page.parent / link.split("#")[0].split("?")[0]).resolve()
            if not target.exists():
                broken.append(f"{page.relative_to(book)} -> {link}")
    assert not broken, broken[:20]


def test_math_is_rendered_with_a_local_mathjax_and_the_figures_are_there(book):
    page = (book / "02_network_from_scratch.html").read_text()
    assert 'src="_static/mathjax/tex-chtml.js"' in page and "cdn" not in page.lower()
    assert page.count('class="math') >= 10
    assert (book / "_static" / "mathjax" / "tex-chtml.js").is_file()
    for name in NOTEBOOKS:
        notebook = json.loads((ROOT / "notebooks" / f"{name}.ipynb").read_text())
        figures = sum("image/png" in output.get("data", {}) for cell in notebook["cells"]
                      for output in cell.get("outputs", []))
        assert (book / f"{name}.html").read_text().count("<img") >= figures, name


def test_the_api_pages_come_from_the_docstrings(book):
    api = (book / "api.html").read_text()
    for name in ("nnlib.lesson02_network.network.Network", "nnlib.lesson09_ring_allreduce.allreduce.ring_allreduce", "nnlib.lesson12_pipeline.pipeline.PipelineMLP",
                 "nnlib.course.deadline.watch"):
        assert f'id="{name}"' in api, name
    assert "delta_l = (delta_{l+1} @ W_{l+1}.T) * a_l * (1 - a_l)" in api  # the math, as written
    missing = [name for name in documented_members() if f'id="{name}"' not in api]
    assert not missing, f"documented in the code but not on the API page: {missing}"


def documented_members() -> list[str]:
    """The full names of every public function and class with a docstring, in each module of the API page that
    lists its members (the lesson folders' own modules; their packages' __init__ lists none)."""
    import importlib
    import inspect

    sys.path.insert(0, str(ROOT / "book"))
    try:
        from build import PACKAGES, modules_by_lesson
    finally:
        sys.path.remove(str(ROOT / "book"))
    names = []
    for _, module_name in modules_by_lesson():
        if module_name in PACKAGES:
            continue
        module = importlib.import_module(f"nnlib.{module_name}")
        names += [f"{module.__name__}.{name}" for name, member in vars(module).items()
                  if not name.startswith("_") and (inspect.isfunction(member) or inspect.isclass(member))
                  and member.__module__ == module.__name__ and member.__doc__]
    assert len(names) > 100, names  # every lesson's modules, not an empty folder's
    return names


def test_the_teacher_notes_are_a_page_of_the_book(book):
    index = (book / "index.html").read_text()
    assert 'href="teaching.html"' in index
    notes = (book / "teaching.html").read_text()
    assert "When the cluster misbehaves in class" in notes and "<table" in notes


def test_a_page_opened_in_the_browser_shows_its_math_and_a_figure(book):
    """The book in headless Chromium (as in tests/test_browser.py): MathJax typesets the formulas of
    lesson 02 (from the local copy: the page is opened from disk, offline) and its figures load."""
    from browser import chromium_path, playwright_or_why

    chromium, why = chromium_path()
    if chromium is None or playwright_or_why():
        pytest.skip(why or playwright_or_why())
    from playwright.sync_api import sync_playwright

    with sync_playwright() as driver:
        browser = driver.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 900})
            page.goto((book / "02_network_from_scratch.html").as_uri())
            page.wait_for_function("() => document.querySelectorAll('mjx-container').length >= 10", timeout=60_000)
            assert page.locator("mjx-container merror").count() == 0  # no formula MathJax could not parse
            figures = page.eval_on_selector_all("img", "images => images.filter(i => i.complete && i.naturalWidth > 100)"
                                                       ".length")
            assert figures >= 1
            figure = page.locator("img").first
            figure.scroll_into_view_if_needed()
            assert figure.is_visible() and figure.bounding_box()["width"] > 100
            (ROOT / "build" / "browser").mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(ROOT / "build" / "browser" / "book-02.png"))
        finally:
            browser.close()
