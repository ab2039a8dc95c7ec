"""The kvpool what-if dashboard (Streamlit).

``streamlit_app.py`` is the entrypoint (sidebar controls and navigation), ``views/`` holds
one script per page, ``controls.py`` the what-if controls, ``compute.py`` the cached stage
results (with ``breakeven.py``, ``calibration.py``, ``replays.py`` and ``answers.py``,
the calls built on them), ``changes.py`` what a what-if moved, ``charts.py`` the Altair figures, ``state.py`` the session's trace and
error display, ``command.py`` the ``kvpool dashboard`` command. Nothing here analyses:
every number comes from analyzer/.
"""
