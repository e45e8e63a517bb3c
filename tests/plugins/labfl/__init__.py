"""A lab's own FL pieces, outside hpcfl: what a researcher adds without forking (tests/test_plugins.py
names them in a job file by import path, "labfl.algorithm:HalfStep" and so on)."""
