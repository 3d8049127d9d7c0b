"""`python -m server`: start the OpenAI-compatible server."""

from server.cli import main

main()
