"""Sphinx configuration of the series as a book (built by book/build.py: `make book`).

Offline by design: the notebooks' saved outputs are used (nothing is executed), the theme is
Sphinx's own alabaster, and MathJax comes from the sphinx-mathjax-offline package instead of a CDN.
"""

import os
import sys

sys.path.insert(0, os.path.abspath(os.environ.get("NNLIB_SOURCE", "..")))  # nnlib, for the API pages

project = "nnlib: how neural-network training is parallelized"
author = "the nnlib authors"
extensions = ["myst_nb", "sphinx.ext.autodoc", "sphinx.ext.mathjax", "sphinx-mathjax-offline"]
myst_enable_extensions = ["dollarmath", "amsmath"]
nb_execution_mode = "off"          # the notebooks' saved (tested) outputs, as executed
nb_merge_streams = True
html_theme = "alabaster"
html_title = project
html_theme_options = {"fixed_sidebar": True, "page_width": "1180px", "sidebar_width": "260px"}
exclude_patterns = ["_build", "**.ipynb_checkpoints", "results"]
autodoc_member_order = "bysource"
autodoc_mock_imports = ["cupy"]
suppress_warnings = ["mystnb.unknown_mime_type"]


def literal_docstrings(app, what, name, obj, options, lines):
    """nnlib's docstrings are plain text (math and shapes in ASCII): show them as written."""
    if lines:
        lines[:] = ["::", ""] + ["    " + line for line in lines] + [""]


def setup(app):
    app.connect("autodoc-process-docstring", literal_docstrings)
