# Loaded by `make lab` (JUPYTER_CONFIG_PATH=etc/jupyter); `zfree lab` passes the same two settings on
# JupyterLab's command line (zfree_lab.report.lab_launch: a wheel has no etc/): notebooks are saved without
# outputs, so a JupyterLab session leaves `git status` clean (zfree_lab.report.lab), and open without being
# marked unsaved: jupytext's contents manager, handing each notebook its kernel's language_info
# (zfree_lab.report.lab_contents).
c.ServerApp.contents_manager_class = "zfree_lab.report.lab_contents.LabContentsManager"  # noqa: F821 - `c`: the traitlets config
c.ContentsManager.pre_save_hook = "zfree_lab.report.lab.strip_on_save"  # noqa: F821
