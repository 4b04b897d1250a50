"""The report layer (top, below the cli): figures, report tables and verdicts, ipywidgets, JupyterLab's strip-on-save."""
