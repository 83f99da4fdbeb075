"""``python -m gradwatch_server.cli``: the same as the ``gradwatch`` command."""

from gradwatch_server.cli import main

main()
