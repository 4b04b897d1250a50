"""The wheel's one build step (issue 41): the files of the clone's root that a run needs (the notebooks
it executes, the shipped benchmarks and base runs, the YAML specs) are copied into the built package
as ``zfree/_shipped/``, in the clone's own layout. ``zfree.core.paths.ROOT`` is that folder in an
installed wheel and the repository root in a clone, so every path derived from it, and every stored
``zfree:<path>`` (``zfree:data/synth/default``), names the same file in both. The metadata and the
package list are in pyproject.toml; this file only adds the step.

Why copied at build time rather than notebooks/ and data/ moved under src/zfree: the layout (docs/reference/layout.md) keeps the
recipes (notebooks, specs, data) beside the package, not in it; ``zfree:`` paths stored in existing run
folders are written from the clone root; src/zfree/data is already the data-pipeline subpackage; and
the Makefile, JupyterLab's root, the nbstripout filter, the tests and the docs all name notebooks/ and
data/. The clone's files stay the one source: nothing is copied into src/, and an editable install
(``pip install -e``, ``make install``) reads the clone itself.
"""

from pathlib import Path

#: what the wheel ships from the clone's root (MANIFEST.in puts the same files in the sdist, which
#: ``python -m build`` builds the wheel from): every notebook a run or a report executes, the shipped
#: data (the synthetic benchmark, its base run, E2E with its base: ~16 MB, ~5 MB compressed), the specs
#: (sweeps, the own-study example, every `zfree study --preset`)
SHIPPED = ("notebooks/*.ipynb", "data/**/*", "analysis/sweeps/*.yaml", "analysis/studies/*.yaml",
           "analysis/studies/presets/*.yaml")
#: the folder they go to inside the package (``zfree.core.paths.INSTALLED_ROOT``)
TARGET = ("zfree", "_shipped")


def shipped_files(root: Path) -> list[Path]:
    """The files of ``SHIPPED`` under ``root``, relative to it (hidden files and caches left out)."""
    found = {p.relative_to(root) for pattern in SHIPPED for p in root.glob(pattern) if p.is_file()}
    return sorted(p for p in found if not any(part.startswith(".") or part == "__pycache__" for part in p.parts))


def copy_shipped(build_lib: str, copy_file) -> None:
    """``shipped_files`` copied under ``build_lib/zfree/_shipped`` with ``copy_file(src, dst)``."""
    root = Path(__file__).resolve().parent
    files = shipped_files(root)
    if not any(p.parts[0] == "notebooks" for p in files):
        raise RuntimeError(f"no notebooks/*.ipynb under {root}: the wheel could not train")
    for rel in files:
        target = Path(build_lib, *TARGET, rel)
        target.parent.mkdir(parents=True, exist_ok=True)
        copy_file(str(root / rel), str(target))


if __name__ == "__main__":  # as setuptools runs it; tests/test_paths.py reads SHIPPED without setuptools
    from setuptools import setup
    from setuptools.command.build_py import build_py

    class build_py_with_shipped(build_py):
        """setuptools' build_py, then ``SHIPPED`` copied under ``build_lib/zfree/_shipped``."""

        def run(self):
            super().run()
            if not getattr(self, "editable_mode", False):  # an editable install reads the clone's own files
                copy_shipped(self.build_lib, lambda src, dst: self.copy_file(src, dst, preserve_mode=False))

    setup(cmdclass={"build_py": build_py_with_shipped})
