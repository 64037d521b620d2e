"""``python -m services.console``."""

from services.console.app import main

main()
