"""``python -m analyzer.cli``: the same as the ``kvpool`` command."""

from analyzer.cli import main

main()
