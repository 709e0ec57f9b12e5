"""pytest configuration for the Python binding's tests.

test_spec.py is the upstream spec (it imports torch at module level and needs
2 GPUs); without torch it cannot even be collected, so skip collecting it.
"""

import importlib.util

collect_ignore = []
if importlib.util.find_spec("torch") is None:
    collect_ignore.append("test_spec.py")
