"""Loaded at start-up by every Python process of a test session run with `--clock-speed`
(the option puts this folder on PYTHONPATH): the process reads the session's fast clock."""

import fakeclock

fakeclock.install_from_env()
