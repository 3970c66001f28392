"""``python -m loadshed``: the ``loadshed`` command line (the same as the ``loadshed`` script)."""

from __future__ import annotations

from loadshed.cli import main

if __name__ == "__main__":
    main()
